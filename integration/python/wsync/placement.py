"""Node ids as the named layouts place processes (planner/named_layouts.h: the ppn and colocated
keys), for jobs that simulate nodes on one machine. A job spread over real hosts leaves node_id
unset: each process then reports its host name, and colocated engines share their host's.

Path classes follow node ids: two processes with equal node ids are intra_node, else inter_node.
"""

ROLES = ("trainer", "rollout")


def node_id(role, rank, ppn=8, colocated=False):
    """The node of rank `rank` of side `role`: "node<rank // ppn>" when the sides are colocated
    (rollout rank r on trainer rank r's node), else "<role>-node<rank // ppn>"."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    if not isinstance(ppn, int) or ppn < 1:
        raise ValueError(f"ppn must be a positive int, got {ppn!r}")
    node = rank // ppn
    return f"node{node}" if colocated else f"{role}-node{node}"
