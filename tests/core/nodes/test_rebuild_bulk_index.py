"""A rebuild files its nodes in the index once, after the bulk load: the index it ends with (buckets, leaf
totals, open devices, best fit's order) and the placements that follow equal a live ledger's."""

from __future__ import annotations

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Placement, Request
from tests.benchmarks.bench_allocator import KEY, _pod, cluster, node_objects


def _non_empty(buckets: dict) -> dict:
    return {k: v for k, v in buckets.items() if v}


def test_rebuilt_index_and_later_placements_equal_the_live_ledger():
    nodes = cluster(120, 8, 4)
    live = Ledger(LedgerConfig(placement_key=KEY))
    for n in nodes:
        live.upsert_node(n)
    pods = []
    for i in range(360):
        if i % 4:
            r = Request(id=f"w{i}", gpus=1 + i % 3, cpu_milli=500)
        else:
            r = Request(id=f"s{i}", gpu_milli=250, cpu_milli=100)
        p = live.reserve(r, 0.0)
        assert isinstance(p, Placement), p
        pods.append(_pod(r.id, p))
    rebuilt = Ledger.rebuild([*node_objects(nodes), *pods], LedgerConfig(placement_key=KEY), now=0.0)
    a, b = live.index, rebuilt.index
    assert a._key == b._key
    assert _non_empty(a.all.by_free) == _non_empty(b.all.by_free)
    assert _non_empty(a.leaves_by_total) == _non_empty(b.leaves_by_total)
    assert _non_empty(a.fit_buckets()) == _non_empty(b.fit_buckets())
    for strategy in ("best_fit", "distributed", "consolidated", "least_utilized"):
        for i in range(60):
            rid = f"x-{strategy}-{i}"
            r = (
                Request(id=rid, gpus=1 + i % 2, strategy=strategy)
                if i % 3
                else Request(id=rid, gpu_milli=300)
            )
            p, q = live.reserve(r, 0.0), rebuilt.reserve(r, 0.0)
            assert (type(p), getattr(p, "node", None), getattr(p, "devices", None)) == (
                type(q),
                getattr(q, "node", None),
                getattr(q, "devices", None),
            )
