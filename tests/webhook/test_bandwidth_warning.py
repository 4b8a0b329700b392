"""A minimum network bandwidth no node states, through the real aiohttp server over real TLS: the pod is
placed and the AdmissionReview response carries the ledger's warning naming the label; the placement
annotation the validating webhook checks is the one it would be without the warning."""

from __future__ import annotations

import contextlib
import ssl

import aiohttp

from devcluster.nodes import make_node
from gpuledger.certs.pki import make_ca, make_serving_cert, write_bundle
from gpuledger.core.pods.placement_codec import decode_placement
from gpuledger.names import NETWORK_BANDWIDTH_LABEL, PLACEMENT_ANNOTATION
from gpuledger.webhook.admission.review import decode_patch, make_review
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.transport.app import create_app
from gpuledger.webhook.transport.server import start_server
from gpuledger.webhook.transport.tls import ReloadingTLS
from tests.webhook.webhook_support import HMAC_KEY, Clock, apply_patch, config, gpu_pod, service

BANDWIDTH = {"topology.scheduler/network-bandwidth": "200Gb"}


def nodes(bandwidth_gbps: int | None) -> list[dict]:
    return [
        make_node(
            f"node-{i}",
            spine="spine-0",
            leaf="leaf-0",
            gpus=8,
            agentaflow=True,
            bandwidth_gbps=bandwidth_gbps,
        )
        for i in range(2)
    ]


@contextlib.asynccontextmanager
async def webhook(tmp_path, objects: list[dict]):
    ca = make_ca()
    paths = write_bundle(tmp_path, ca, make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
    tls = ReloadingTLS(paths["tls.crt"], paths["tls.key"], None, poll_interval_s=60)
    app = create_app(config(), InProcessLedgerClient(service(objects), Clock()))
    server = await start_server(app, "127.0.0.1", 0, tls)
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:

            async def post(route: str, pod: dict, uid: str) -> dict:
                async with session.post(f"{server.url}/{route}", json=make_review(pod, uid=uid)) as resp:
                    assert resp.status == 200
                    return (await resp.json())["response"]

            yield post
    finally:
        await server.stop()


async def test_no_node_states_a_bandwidth_the_pod_is_placed_and_the_response_warns(tmp_path):
    async with webhook(tmp_path, nodes(None)) as post:
        pod = gpu_pod(4, name="trainer", annotations=BANDWIDTH, namespace="ml")
        answer = await post("mutate", pod, "u1")
        assert answer["allowed"], answer
        assert answer["warnings"] == [
            "topology.scheduler/network-bandwidth 200Gb not checked: no node has the label "
            f"{NETWORK_BANDWIDTH_LABEL} (or the node agent's agentaflow.gpu/network-bandwidth-gbps); "
            "label the nodes to enforce it"
        ]
        stored = apply_patch(pod, decode_patch(answer))
        placement = decode_placement(stored["metadata"]["annotations"][PLACEMENT_ANNOTATION], HMAC_KEY)
        assert placement is not None and len(placement.devices) == 4 and placement.warnings == ()
        checked = await post("validate", stored, "u2")
        assert checked["allowed"], checked
        assert "warnings" not in checked


async def test_where_nodes_state_a_bandwidth_there_is_no_warning_and_the_minimum_holds(tmp_path):
    async with webhook(tmp_path, nodes(400)) as post:
        answer = await post("mutate", gpu_pod(1, name="fast", annotations=BANDWIDTH, namespace="ml"), "u1")
        assert answer["allowed"] and "warnings" not in answer, answer
    async with webhook(tmp_path, nodes(100)) as post:
        answer = await post("mutate", gpu_pod(1, name="slow", annotations=BANDWIDTH, namespace="ml"), "u2")
        assert not answer["allowed"]
        assert NETWORK_BANDWIDTH_LABEL in answer["status"]["message"]
