"""Placement as the named layouts place processes (planner/named_layouts.h: the ppn and colocated
keys), for jobs that simulate nodes on one machine. A job spread over real hosts leaves node_id
unset: each process then reports its host name, and colocated engines share their host's.

Path classes follow node ids and GPUs: two processes with equal node ids are same_device when both
GPUs are known and equal, else intra_node; different node ids are inter_node.
"""

ROLES = ("trainer", "rollout")


def _check(role, rank, ppn):
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    if not isinstance(ppn, int) or ppn < 1:
        raise ValueError(f"ppn must be a positive int, got {ppn!r}")


def node_id(role, rank, ppn=8, colocated=False):
    """The node of rank `rank` of side `role`: "node<rank // ppn>" when the sides are colocated
    (rollout rank r on trainer rank r's node), else "<role>-node<rank // ppn>"."""
    _check(role, rank, ppn)
    node = rank // ppn
    return f"node{node}" if colocated else f"{role}-node{node}"


def device(role, rank, ppn=8, colocated=False):
    """The GPU (node-wide index) of rank `rank` of side `role`: rank % ppn when the sides are
    colocated (rollout rank r on trainer rank r's GPU), else None (the named layouts do not say)."""
    _check(role, rank, ppn)
    return rank % ppn if colocated else None


def with_placement(spec, ppn=None, colocated=None):
    """`spec` ("vllm(tp=2)") with the placement keys given: "vllm(tp=2,ppn=4,colocated=1)". A
    process that passes the result to Session.set_named_layout is placed as `wsync plan` places its
    rank (its node, and with colocated its GPU); give the same keys on both sides."""
    if not isinstance(spec, str) or not spec.endswith(")") or "(" not in spec:
        raise ValueError(f"spec must look like 'kind(key=value,...)', got {spec!r}")
    keys = []
    if ppn is not None:
        if not isinstance(ppn, int) or ppn < 1:
            raise ValueError(f"ppn must be a positive int, got {ppn!r}")
        keys.append(f"ppn={ppn}")
    if colocated is not None:
        keys.append(f"colocated={1 if colocated else 0}")
    if not keys:
        return spec
    inner = spec[spec.index("(") + 1:-1].strip()
    return f"{spec[:spec.index('(')]}({inner + ',' if inner else ''}{','.join(keys)})"
