"""Ledger totals per leaf, per spine and over the cluster."""

from __future__ import annotations

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Request
from tests.core.core_factory import leafy_cluster

KEY = b"objects"


def make(*objs, **config) -> Ledger:
    led = Ledger(LedgerConfig(placement_key=KEY, **config))
    for o in objs:
        led.apply_object(o, 0.0)
    return led


def test_stats_totals_per_leaf_and_spine():
    led = make(*leafy_cluster(spines=2, leaves=2, per_leaf=2, gpus=4))
    led.reserve(Request(id="w", gpus=2), 0.0)
    led.reserve(Request(id="s", gpu_milli=500), 0.0)
    led.confirm("w", 0.0)
    st = led.stats()
    assert (st.nodes, st.gpus_total, st.milli_total) == (8, 32, 32000)
    assert st.milli_allocated == 2500 and st.reservations_pending == 1 and st.reservations_confirmed == 1
    assert len(st.leaves) == 4 and len(st.spines) == 2
    assert sum(s.milli_free for s in st.spines) == 32000 - 2500
    d = st.as_dict()
    assert d["leaves"][0]["utilization"] >= 0 and "fragmentation" in d
