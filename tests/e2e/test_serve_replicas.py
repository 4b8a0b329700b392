"""Two `gpuledger serve` replicas, each its own process with its own cluster sync, sharing one Ray ledger
actor: only the holder of the ledger's sync lease writes, and a replica that stops hands it to the other,
which lists and then keeps the ledger true (a deleted pod's GPUs freed, a new pod confirmed).

Its own control plane and its own Ray head (a process of this test, stopped with it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devcluster.binaries import free_port
from devcluster.cluster import ALICE, ControlPlane
from devcluster.nodes import create_nodes, make_sample_cluster
from devcluster.serve_process import GpuledgerServe
from tests.conftest import require_binaries
from tests.e2e.conftest import gpu_pod_yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _ray_head(tmp: Path) -> tuple[subprocess.Popen, str]:
    """`ray start --head --block` on 127.0.0.1: ends (and takes its Ray processes with it) on SIGTERM."""
    port = free_port()
    ray_cli = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [
            str(ray_cli),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={tmp}",
        ],
        stdout=open(tmp / "head.log", "wb"),  # noqa: SIM115 - the head writes to it until it ends
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while b"Ray runtime started" not in (tmp / "head.log").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray head did not start:\n{(tmp / 'head.log').read_text(errors='replace')}")
        time.sleep(0.5)
    return proc, f"127.0.0.1:{port}"


def test_two_replicas_one_sync_writes_and_a_stopping_one_hands_over(monkeypatch):
    require_binaries(with_controllers=False)
    # Ray turns 127.0.0.1 into the machine's address unless told it is not clustering: everything stays on
    # the loopback (the head and both replicas inherit these)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # `ray start` turns token auth on; nothing else joins
    ray_tmp = Path(f"/tmp/gl-ray-{free_port()}")  # short: Ray's socket paths must fit in 107 bytes
    ray_tmp.mkdir()
    head, address = _ray_head(ray_tmp)
    try:
        with ControlPlane(with_controllers=False) as cp:
            create_nodes(cp.api_client(), make_sample_cluster())
            first = GpuledgerServe(cp, None, "--ray-address", address)
            second = None
            try:
                first.wait("/readyz", timeout=180)
                cp.wait_for(lambda: first.metric("gpuledger_sync_lease_held") == 1, what="first holds")
                second = GpuledgerServe(cp, None, "--ray-address", address)
                second.wait("/readyz", timeout=180)
                assert second.metric("gpuledger_sync_lease_held") == 0  # standing by, watching
                second.register()  # the API server calls the replica that stays
                cp.create_namespace("team-a")
                cp.kubectl(
                    "apply", "-n", "team-a", "-f", "-", input=gpu_pod_yaml("one", gpus=4), as_user=ALICE
                )
                cp.wait_for(lambda: second.metric("agentaflow_workloads_running") == 1, what="one confirmed")
                assert second.metric("gpuledger_sync_lease_held") == 0  # confirmed by the first's events

                assert first.stop() == 0, first.final_log  # hands the lease back as it stops
                cp.wait_for(lambda: second.metric("gpuledger_sync_lease_held") == 1, what="takeover")
                cp.kubectl("delete", "pod", "one", "-n", "team-a", as_user=ALICE)
                cp.kubectl(
                    "apply", "-n", "team-a", "-f", "-", input=gpu_pod_yaml("two", gpus=2), as_user=ALICE
                )
                cp.wait_for(  # the deletion freed its 4 GPUs, the new pod's 2 are confirmed: the new writer's
                    lambda: (
                        second.metric("topology_gpu_allocation_ratio") == pytest.approx(2 / 128)
                        and second.metric("agentaflow_workloads_running") == 1
                    ),
                    what="the second replica's sync keeping the ledger true",
                )
            finally:
                if first.proc.poll() is None:
                    first.stop()
                if second is not None:
                    assert second.stop() == 0, second.final_log
    finally:
        head.terminate()
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
