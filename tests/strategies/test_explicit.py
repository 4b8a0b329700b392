"""explicit: the gpu-scheduling-map; pinned devices exactly, or a denial that names why."""

from __future__ import annotations

from gpuledger.core.model import Denial, PinnedDevices, Placement, Reason, Request
from tests.core.core_factory import node
from tests.strategies.support import make


def test_pinned_map_exact_devices_and_denials():
    devices = [{"index": i, "healthy": i != 3} for i in range(4)]
    led = make(node("a", 4, devices=devices), node("b", 4))
    p = led.reserve(Request(id="1", gpus=2, pinned=PinnedDevices("a", (2, 0))), 0.0)
    assert isinstance(p, Placement) and p.node == "a" and p.devices == (0, 2) and p.strategy == "explicit"
    for rid, pin, why in [
        ("2", PinnedDevices("a", (0,)), "taken"),
        ("3", PinnedDevices("a", (3,)), "unhealthy"),
        ("4", PinnedDevices("a", (7,)), "does not exist"),
        ("5", PinnedDevices("zz", (0,)), "unknown"),
    ]:
        d = led.reserve(Request(id=rid, gpus=1, pinned=pin), 0.0)
        assert isinstance(d, Denial) and d.by_reason == ((Reason.PINNED, 1),), d
        assert why in d.message and "gpu-scheduling-map" in d.message
    s = led.reserve(Request(id="6", gpu_milli=300, pinned=PinnedDevices("b", (1,))), 0.0)
    assert s.shares[0].device == 1 and s.node == "b"
