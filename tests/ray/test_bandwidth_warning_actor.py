"""The ledger's warning for a bandwidth no node states crosses the real Ray actor, by Ray calls and by the
direct ledger channel, with the placement it belongs to."""

from __future__ import annotations

import uuid

import pytest

from devcluster.nodes import make_node
from gpuledger.core.model import Placement, Request
from gpuledger.ray.actor import get_or_create_ledger, wait_ready
from gpuledger.service.ledger_service import AdmitCall
from gpuledger.webhook.ledger.client import RayLedgerClient
from tests.ray.test_actor import ray_local, write_objects  # noqa: F401 - ray_local: a fixture
from tests.webhook.webhook_support import config

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def unlabelled_actor(tmp_path):
    source = tmp_path / f"cluster-{uuid.uuid4().hex[:6]}.yaml"
    nodes = [
        make_node(f"node-{i}", "spine-0", "leaf-0", gpus=8, agentaflow=True, bandwidth_gbps=None)
        for i in range(2)
    ]
    write_objects(source, nodes)
    handle = get_or_create_ledger(
        config().ledger_config(),
        {"kind": "file", "path": str(source)},
        name=f"bandwidth-{uuid.uuid4().hex[:8]}",
        namespace="gpuledger-test",
    )
    wait_ready(handle)
    return handle


@pytest.mark.parametrize("channel", ["auto", "off"])
async def test_the_warning_crosses_the_actor(tmp_path, channel):
    client = RayLedgerClient(unlabelled_actor(tmp_path), channel=channel)
    try:
        placed = await client.admit(AdmitCall(Request(id="a", gpus=2, network_bandwidth_gbps=200.0)))
        assert isinstance(placed, Placement) and len(placed.devices) == 2
        assert len(placed.warnings) == 1 and "agentaflow.gpu/network-bandwidth-gbps" in placed.warnings[0]
        assert client.transport_calls["channel" if channel == "auto" else "ray"] >= 1
        plain = await client.admit(AdmitCall(Request(id="b", gpus=1)))
        assert isinstance(plain, Placement) and plain.warnings == ()
    finally:
        await client.close()
