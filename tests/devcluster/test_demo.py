"""`gpuledger demo` end to end, as `make demo` runs it, in both modes;
in subprocesses (own Ray, own ports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.cluster import ControlPlane
from tests.conftest import require_binaries

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PLACED = ("train-small", "notebook", "eval", "shared", "on-tainted", "h100", "allreduce-", "inference-")


def run_demo(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "gpuledger", "demo", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def check_table(out: str) -> None:
    rows = [line for line in out.splitlines() if line.split() and line.split()[0].startswith(PLACED)]
    assert len(rows) == 6 + 4 + 3, out  # six pods, the Job's four, the Deployment's three
    assert all("leaf-" in row and "DENIED" not in row for row in rows), out
    allreduce_leaves = {row.split()[3] for row in rows if row.startswith("allreduce-")}
    assert len(allreduce_leaves) == 1, out
    assert "DENIED: gpuledger: no placement for pod gpuledger-demo/too-big" in out
    assert "agentaflow.gpu/scheduling-strategy='fastest' is not accepted" in out


def check_queue(out: str) -> None:
    """Two tables of (workload, priority, phase, queue position): before and after `urgent` is deleted."""
    assert "GPUWorkload queue:" in out, out
    section = out.split("GPUWorkload queue:", 1)[1]
    before_text, after_text = section.split("deleting urgent ...", 1)

    def table(text: str) -> dict[str, tuple[str, str, str]]:
        rows = [line.split() for line in text.splitlines() if line.startswith("  ") and line.split()]
        return {r[0]: (r[1], r[3], r[4]) for r in rows if r[0] != "WORKLOAD"}

    before, after = table(before_text), table(after_text)
    assert before == {
        "urgent": ("10", "Running", "-"),
        "finetune": ("5", "Running", "-"),
        "sweep": ("1", "Queued", "1"),
        "nightly": ("0", "Queued", "2"),
    }, out
    # the freed GPUs go to the highest priority waiting, not the oldest (nightly was submitted first)
    assert after == {
        "finetune": ("5", "Running", "-"),
        "sweep": ("1", "Running", "-"),
        "nightly": ("0", "Queued", "1"),
    }, out
    assert "NotEnoughGpus" in before_text, out


def test_demo_on_its_own_control_plane():
    require_binaries()
    proc = run_demo()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_table(proc.stdout)
    assert "ledger: 16 nodes" in proc.stdout
    check_queue(proc.stdout)


def test_demo_with_a_given_kubeconfig():
    require_binaries()
    with ControlPlane() as cp:
        proc = run_demo("--use-current-kubeconfig", "--kubeconfig", cp.kubeconfig, "--sample-nodes")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        check_table(proc.stdout)
        assert "GPUWorkload queue:" not in proc.stdout  # only on its own control plane (it plays the kubelet)
        # it cleans up after itself: its webhook registrations are gone, its namespace is being deleted
        assert cp.kubectl("get", "mutatingwebhookconfigurations", "-o", "name").stdout.strip() == ""
