"""wsync.placement: node ids as the named layouts place processes (no torch, no library)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.setup_path()
from wsync import placement  # noqa: E402


class PlacementTest(unittest.TestCase):
    def test_separate_nodes_per_side(self):
        self.assertEqual([placement.node_id("trainer", r, ppn=2) for r in range(5)],
                         ["trainer-node0", "trainer-node0", "trainer-node1", "trainer-node1",
                          "trainer-node2"])
        self.assertEqual(placement.node_id("rollout", 9), "rollout-node1")  # ppn 8

    def test_colocated_rollout_rank_shares_its_trainer_ranks_node(self):
        for rank in range(12):
            self.assertEqual(placement.node_id("trainer", rank, ppn=4, colocated=True),
                             placement.node_id("rollout", rank, ppn=4, colocated=True))
        self.assertEqual(placement.node_id("rollout", 5, ppn=4, colocated=True), "node1")
        self.assertNotEqual(placement.node_id("trainer", 3, ppn=4, colocated=True),
                            placement.node_id("rollout", 4, ppn=4, colocated=True))

    def test_bad_arguments_are_refused(self):
        for args, kwargs in [(("critic", 0), {}), (("trainer", -1), {}),
                             (("trainer", 0), {"ppn": 0}), (("rollout", 1.5), {})]:
            with self.assertRaises(ValueError):
                placement.node_id(*args, **kwargs)


if __name__ == "__main__":
    unittest.main()
