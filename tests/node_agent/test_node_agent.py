"""The node agent's patch is what the ledger reads: device identity, health, and the selection labels."""

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuledger.cli.main import main as cli_main
from gpuledger.node_agent.agent import node_patch, utilization_tier
from gpuledger.node_agent.probes import (
    DeviceReport,
    FakeProbe,
    NvmlProbe,
    ProbeError,
    QueryFailed,
    memory_health,
)
from tests.node_agent.node_store import NodeStore

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_fake_spec_marks_unhealthy_devices():
    reports = FakeProbe.from_spec("4xNVIDIA-A100-SXM4-80GB:81920,unhealthy=1,3").devices()
    assert [r.index for r in reports] == [0, 1, 2, 3]
    assert [r.healthy for r in reports] == [True, False, True, False]
    assert {r.memory_mib for r in reports} == {81920}
    assert len({r.uuid for r in reports}) == 4


@pytest.mark.parametrize("spec", ["eightxA100:80", "8xA100", "8xA100:80,broken=1", ""])
def test_bad_fake_spec_names_the_value_and_the_form(spec):
    with pytest.raises(ValueError) as err:
        FakeProbe.from_spec(spec)
    assert "COUNTxPRODUCT:MEMORY_MIB" in str(err.value) or "unhealthy=I,J" in str(err.value)


def test_patch_carries_devices_labels_and_time():
    patch = node_patch(FakeProbe.from_spec("2xH100:81559,unhealthy=1").devices(), NOW)
    labels, annotations = patch["metadata"]["labels"], patch["metadata"]["annotations"]
    assert labels == {
        "agentaflow.gpu/enabled": "true",
        "agentaflow.gpu/schedulable": "true",
        "agentaflow.gpu/count": "2",
        "agentaflow.gpu/utilization-tier": "low",
    }
    devices = json.loads(annotations["agentaflow.gpu/devices"])
    assert [(d["index"], d["healthy"], d["memoryMiB"], d["product"]) for d in devices] == [
        (0, True, 81559, "H100"),
        (1, False, 81559, "H100"),
    ]
    assert annotations["agentaflow.gpu/status"] == "degraded"
    assert annotations["agentaflow.gpu/last-update"] == "2026-11-22T12:00:00Z"


def test_all_unhealthy_node_is_not_schedulable():
    patch = node_patch(FakeProbe.from_spec("2xH100:81559,unhealthy=0,1").devices(), NOW)
    assert patch["metadata"]["labels"]["agentaflow.gpu/schedulable"] == "false"
    assert patch["metadata"]["annotations"]["agentaflow.gpu/status"] == "unhealthy"


@pytest.mark.parametrize(
    "utilizations, tier", [([], "none"), ([0, 10], "low"), ([50, 60], "medium"), ([90, 80], "high")]
)
def test_utilization_tier(utilizations, tier):
    reports = [
        DeviceReport(i, f"u{i}", "A100", 1, True, utilization_pct=u) for i, u in enumerate(utilizations)
    ]
    assert utilization_tier(reports) == tier


def test_nvml_probe_without_a_gpu_is_a_clear_error():
    try:
        probe = NvmlProbe()
    except ProbeError as exc:
        assert "NVML is not available" in str(exc)
    else:  # a machine with a GPU: the real path must report real devices
        reports = probe.devices()
        probe.close()
        assert reports and all(r.uuid.startswith(("GPU-", "MIG-")) for r in reports)


@pytest.mark.parametrize(
    "retired, remapped, words",
    [
        (None, None, ""),  # neither query supported: nothing known against the memory
        (0, (0, 0, 0, 0), ""),
        (None, (12, 0, 0, 0), ""),  # rows remapped and in effect: repaired memory is healthy
        (1, None, "retired memory pages pending a reset"),
        (None, (0, 1, 1, 0), "row remapping is pending a GPU reset"),
        (
            None,
            (3, 2, 0, 1),
            "row remapping failed (2 rows remapped for uncorrectable errors, 3 for correctable)",
        ),
        (QueryFailed("Unknown Error"), (0, 0, 0, 0), "page-retirement query failed: Unknown Error"),
        (None, QueryFailed("GPU is lost"), "row-remapping query failed: GPU is lost"),
    ],
)
def test_memory_health_reads_page_retirement_and_row_remapping(retired, remapped, words):
    """Ampere and Hopper GPUs report memory faults by row remapping only; older ones by page retirement."""
    reason = memory_health(retired, remapped)
    assert (words in reason) if words else reason == ""


def test_cli_prints_the_patch(capsys):
    assert cli_main(["node-agent", "--node", "n1", "--fake", "1xT4:15360", "--print"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metadata"]["labels"]["agentaflow.gpu/count"] == "1"


def test_python_dash_m_runs_the_agent_with_its_arguments():
    """`python -m gpuledger.node_agent` once called main() without argv and died with a TypeError."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    argv = ["-m", "gpuledger.node_agent", "--node", "n1", "--fake", "1xT4:15360", "--print"]
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["metadata"]["labels"]["agentaflow.gpu/count"] == "1"


def test_capacity_patch_advertises_the_healthy_gpus():
    from gpuledger.node_agent.agent import capacity_patch

    reports = FakeProbe.from_spec("4xA100:81920,unhealthy=2").devices()
    assert capacity_patch(reports, "nvidia.com/gpu") == {"status": {"capacity": {"nvidia.com/gpu": "3"}}}


def test_agent_advertises_capacity_only_when_asked():
    from gpuledger.node_agent.agent import NodeAgent
    from gpuledger.node_agent.pod_resources import PodResourcesClient

    probe = FakeProbe.from_spec("2xA100:81920")
    missing = PodResourcesClient("/nonexistent/kubelet.sock", 0.1)
    quiet, loud = NodeStore(), NodeStore()
    NodeAgent("n", probe, quiet, pod_resources=missing).publish_once()
    NodeAgent("n", probe, loud, pod_resources=missing, advertise_resource="nvidia.com/gpu").publish_once()
    assert len(quiet.patches) == 1 and quiet.status_patches == []
    assert loud.status_patches == [{"status": {"capacity": {"nvidia.com/gpu": "2"}}}]
