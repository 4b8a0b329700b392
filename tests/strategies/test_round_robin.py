"""round_robin: the next node by name after the previous placement, wrapping."""

from __future__ import annotations

from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_round_robin_rotates_deterministically():
    led = make(node("a", 8), node("b", 8), node("c", 8))
    got = [led.reserve(Request(id=f"r{i}", gpus=1, strategy="round_robin"), 0.0).node for i in range(5)]
    assert got == ["a", "b", "c", "a", "b"]
    # a node that cannot fit is skipped, the rotation continues after the node used
    take(led, "c", 7, "fill-c")
    assert led.reserve(Request(id="r5", gpus=1, strategy="round_robin"), 0.0).node == "a"


def test_the_ring_starts_after_the_cursor_and_wraps_once_in_every_leaf_set():
    """Candidates are every node by name after the cursor, then from the first, each once (for any cursor,
    with and without a leaf restriction)."""
    from gpuledger.core.plugins.plugin import ScoreContext
    from gpuledger.strategies.round_robin import RoundRobin

    names = [f"n{i}" for i in range(7)]
    led = make(*(node(n, 8, leaf=f"l{i % 3}", spine="s") for i, n in enumerate(names)))
    request = Request(id="q", gpus=1, strategy="round_robin")
    for cursor in ["", "n0", "n3", "n35", "n6", "zz"]:
        ctx = ScoreContext(index=led.index, rr_cursor=cursor)
        start = sum(1 for n in names if n <= cursor) if cursor else 0
        ring = names[start:] + names[:start]
        for leaves in (None, [("s", "l1")], [("s", "l0"), ("s", "l2")]):
            got = [n.name for n in RoundRobin().candidates(request, ctx, leaves)]
            want = [n for n in ring if leaves is None or led.index.nodes[n].leaf_key in leaves]
            assert got == want, (cursor, leaves)
