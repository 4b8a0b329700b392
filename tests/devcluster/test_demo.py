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
        timeout=420,
    )


def check_table(out: str) -> None:
    rows = [line for line in out.splitlines() if line.split() and line.split()[0].startswith(PLACED)]
    assert len(rows) == 6 + 4 + 3, out  # six pods, the Job's four, the Deployment's three
    assert all("leaf-" in row and "DENIED" not in row for row in rows), out
    allreduce_leaves = {row.split()[3] for row in rows if row.startswith("allreduce-")}
    assert len(allreduce_leaves) == 1, out
    assert "DENIED: gpuledger: no placement for pod gpuledger-demo/too-big" in out
    assert "agentaflow.gpu/scheduling-strategy='fastest' is not accepted" in out


def part(out: str, number: int) -> str:
    """The text of the demo's part `number`, from its heading to the next one."""
    assert f"\n== {number}. " in out, out
    return out.split(f"\n== {number}. ", 1)[1].split(f"\n== {number + 1}. ", 1)[0]


def check_line(out: str) -> None:
    """Three pods admitted gated in a full cluster, in line by priority then arrival; two start in order on
    the two nodes freed, bound by kube-scheduler; the third still waits."""
    text = part(out, 2)
    gated = [line.split() for line in text.splitlines() if "SchedulingGated" in line]
    assert {row[0] for row in gated} == {"wait-a", "wait-b", "urgent"}, text
    waiting = text.split("PODS WAITING FOR GPUS", 1)[1].split("\n\n", 1)[0]
    line = [row.split() for row in waiting.splitlines()[2:] if row.split()]
    assert [(r[1], r[3]) for r in line] == [("1", "urgent"), ("2", "wait-a"), ("3", "wait-b")], text
    after = text.split("$ kubectl delete pod", 1)[1]
    started = {
        r[0]: r[1:]
        for r in (line.split() for line in after.splitlines())
        if r and r[0] in {"urgent", "wait-a", "wait-b"}
    }
    assert started["urgent"][0] == "Running" and started["wait-a"][0] == "Running", after
    assert started["wait-b"][:2] == ["Pending", "<none>"], after
    assert "default-scheduler" in after and "Successfully assigned gpuledger-demo/urgent to" in after, after


def check_queues(out: str) -> None:
    """Team A borrows team B's 64 GPUs; explain shows the reclaim (four whole gangs, rule reclaim) before team
    B submits; then team B's gang runs, the Events name the rule, and both queues are at quota."""
    text = part(out, 3)
    tables = [t.split("\n\n", 1)[0] for t in text.split("$ kubectl get gpuqueues\n")[1:]]
    assert len(tables) == 2, text

    def row(table: str, name: str) -> list[str]:
        return next(line.split() for line in table.splitlines() if line.split()[:1] == [name])

    assert row(tables[0], "team-a")[1:4] == ["64", "128", "64"], tables[0]  # QUOTA USED BORROWED
    assert row(tables[0], "team-b")[1:4] == ["64", "0", "0"], tables[0]
    victims = [line for line in text.splitlines() if ": rule reclaim: " in line]
    assert len(victims) == 4 and all("(16 GPUs)" in v and "team-a/train-" in v for v in victims), text
    assert "queue team-a borrows" in victims[0], victims
    assert "evicting 8 pod(s) (64 GPUs)" in text, text
    preempted = [line for line in text.splitlines() if " Preempted " in line]
    assert len(preempted) == 8 and all("finetune" in p and "(rule reclaim)" in p for p in preempted), text
    assert {p.split()[0] for p in preempted} == {f"train-{i}" for i in range(4)}, text  # whole gangs
    assert row(tables[1], "team-a")[1:5] == ["64", "64", "0", "8"], tables[1]  # QUOTA USED BORROWED WAITING
    assert row(tables[1], "team-b")[1:4] == ["64", "64", "0"], tables[1]


def test_demo_on_its_own_control_plane():
    require_binaries()
    proc = run_demo()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_table(proc.stdout)
    assert "ledger: 16 nodes" in proc.stdout
    check_line(proc.stdout)
    check_queues(proc.stdout)


def test_demo_with_a_given_kubeconfig():
    require_binaries()
    with ControlPlane() as cp:
        proc = run_demo("--use-current-kubeconfig", "--kubeconfig", cp.kubeconfig, "--sample-nodes")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        check_table(proc.stdout)
        assert "\n== 2. " not in proc.stdout  # only on its own control plane (its stand-in is every kubelet)
        # it cleans up after itself: its webhook registrations are gone, its namespace is being deleted
        assert cp.kubectl("get", "mutatingwebhookconfigurations", "-o", "name").stdout.strip() == ""
