"""`gpuledger serve` as deployed (its own process: Ray ledger, cluster sync, TLS webhook)
against kube-apiserver.

Its own control plane, so its registrations never meet the shared one's.
"""

from __future__ import annotations

import pytest

from devcluster.cluster import ALICE, ControlPlane
from devcluster.nodes import create_nodes, make_sample_cluster
from devcluster.serve_process import HMAC_KEY, GpuledgerServe
from gpuledger.core.pods.placement_codec import decode_placement
from gpuledger.names import PLACEMENT_ANNOTATION
from tests.conftest import require_binaries
from tests.e2e.conftest import gpu_pod_yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_gpuledger_serve_places_confirms_releases_and_stops_cleanly():
    require_binaries(with_controllers=False)
    with ControlPlane(with_controllers=False) as cp:
        create_nodes(cp.api_client(), make_sample_cluster())
        serve = GpuledgerServe(cp)
        try:
            serve.wait("/readyz")  # the ledger answered and the sync's first list reached it
            serve.register()
            cp.create_namespace("team-a")
            cp.kubectl("apply", "-n", "team-a", "-f", "-", input=gpu_pod_yaml("job", gpus=4), as_user=ALICE)
            pod = cp.get_json("pod", "job", "-n", "team-a")
            placement = decode_placement(
                pod["metadata"]["annotations"][PLACEMENT_ANNOTATION], HMAC_KEY.encode()
            )
            assert placement is not None and len(placement.devices) == 4
            cp.wait_for(
                lambda: serve.metric("agentaflow_workloads_running") == 1, what="reservation confirmed"
            )
            assert serve.metric("topology_gpu_allocation_ratio") == pytest.approx(4 / 128)
            cp.kubectl("delete", "pod", "job", "-n", "team-a", as_user=ALICE)
            cp.wait_for(lambda: serve.metric("topology_gpu_allocation_ratio") == 0.0, what="devices released")
        finally:
            rc = serve.stop()
        assert rc == 0, serve.final_log
