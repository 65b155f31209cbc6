"""wsync.placement: node ids and GPUs as the named layouts place processes, and specs with
placement keys (no torch, no library)."""

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

    def test_colocated_rollout_rank_shares_its_trainer_ranks_gpu(self):
        for ppn in (1, 3, 8):
            for rank in range(10):
                gpu = placement.device("rollout", rank, ppn=ppn, colocated=True)
                self.assertEqual(gpu, rank % ppn)
                self.assertEqual(gpu, placement.device("trainer", rank, ppn=ppn, colocated=True))
        # Separate nodes say nothing of GPUs: never same_device.
        self.assertIsNone(placement.device("rollout", 3, ppn=4))

    def test_with_placement_adds_the_keys_the_named_layouts_take(self):
        self.assertEqual(placement.with_placement("vllm(tp=2)", ppn=4, colocated=True),
                         "vllm(tp=2,ppn=4,colocated=1)")
        self.assertEqual(placement.with_placement("megatron()", colocated=False),
                         "megatron(colocated=0)")
        self.assertEqual(placement.with_placement("fsdp(4)"), "fsdp(4)")
        for bad, kwargs in [("vllm", {"ppn": 2}), ("vllm(tp=2)", {"ppn": 0}), (3, {})]:
            with self.assertRaises(ValueError):
                placement.with_placement(bad, **kwargs)

    def test_bad_arguments_are_refused(self):
        for args, kwargs in [(("critic", 0), {}), (("trainer", -1), {}),
                             (("trainer", 0), {"ppn": 0}), (("rollout", 1.5), {})]:
            with self.assertRaises(ValueError):
                placement.node_id(*args, **kwargs)
            with self.assertRaises(ValueError):
                placement.device(*args, **kwargs)


if __name__ == "__main__":
    unittest.main()
