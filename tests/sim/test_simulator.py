"""`gpuledger simulate` end to end through the real Ledger: a tiny hand-computable cluster, the openb trace on
a few nodes, JSON shape, YAML input and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuledger.cli import main as cli
from gpuledger.core.model import Device, NodeInfo, Request
from gpuledger.sim import simulator
from gpuledger.sim.simulator import build_arrivals, replay, simulate

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "openb"
needs_trace = pytest.mark.skipif(not SHARED.is_dir(), reason="shared openb traces not present")


def test_replay_by_hand_through_the_ledger():
    # one node with 2 GPUs (capacity 2000): 1000, 500 fit; 600 no longer fits next to the 500; 1000 neither
    nodes = [NodeInfo("n", 64_000, 256_000, (Device(0), Device(1)))]
    pods = [
        Request("w", gpus=1),
        Request("s5", gpu_milli=500),
        Request("s6", gpu_milli=600),
        Request("w2", gpus=1),
    ]
    arrivals = build_arrivals(pods, 2000, ratio=3100 / 2000, seed=0, shuffle=False)
    assert [r.id for r in arrivals] == ["w", "s5", "s6", "w2"]
    run = replay(nodes, arrivals, "best_fit", seed=0)
    assert run.arrived == [1000, 1500, 2100, 3100]
    assert run.allocated == [1000, 1500, 1500, 1500]
    assert (run.placed, run.failed) == (2, 2)
    assert run.unallocated_at_100 == 25
    # at 100% arrived: GPU 1 holds the 500 share (500 free, partly used); GPU 0 is held whole
    assert run.free_at_100 == {"idle_without_host": 0.0, "idle": 0.0, "partial": 25.0}


def test_cpu_only_pods_take_cpu_but_count_no_gpu():
    nodes = [NodeInfo("n", 10_000, 256_000, (Device(0),))]
    arrivals = [Request("cpu", cpu_milli=8000), Request("gpu", gpus=1, cpu_milli=4000)]
    run = replay(nodes, arrivals, "best_fit", seed=0)
    assert run.arrived == [0, 1000] and run.allocated == [0, 0]  # the CPU pod left too little CPU
    # the GPU is idle on a node with 2 cores left, below the 4 cores the workload's GPU pods bring per GPU
    assert run.free_at_100 == {"idle_without_host": 100.0, "idle": 0.0, "partial": 0.0}


def test_simulate_is_reproducible_per_seed():
    nodes = [NodeInfo(f"n{i}", 64_000, 256_000, tuple(Device(d) for d in range(4))) for i in range(3)]
    pods = [Request("a", gpus=1, cpu_milli=8000), Request("b", gpu_milli=300), Request("c", gpus=2)]
    first = simulate(nodes, pods, ["fgd", "best_fit"], seeds=[1, 2])
    again = simulate(nodes, pods, ["fgd", "best_fit"], seeds=[1, 2])
    assert [[r.allocated for r in s.runs] for s in first] == [[r.allocated for r in s.runs] for s in again]


@needs_trace
def test_cli_json_plot_on_a_trace_subset(tmp_path, capsys):
    png = tmp_path / "curves.png"
    code = cli.main(
        [
            "simulate",
            "--trace",
            str(SHARED),
            "--workload",
            "gpushare40",
            "--limit-nodes",
            "30",
            "--seeds",
            "2",
            "-s",
            "best_fit,fgd",
            "-s",
            "fgd_host",
            "-o",
            "json",
            "--plot",
            str(png),
            "-q",
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == 30 and doc["seeds"] == [42, 43] and doc["ratio"] == 1.3
    assert set(doc["strategies"]) == {"best_fit", "fgd", "fgd_host"}
    for result in doc["strategies"].values():
        assert 0 <= result["unallocated_at_100"] <= 100
        assert set(result["unallocated_at_100_by_seed"]) == {"42", "43"}
        curve = result["curve"]
        assert len(curve["arrived_pct"]) == len(curve["allocation_pct"]) >= 101
        assert curve["arrived_pct"][:3] == [0, 1, 2]
        assert all(0 <= a <= 100 for a in curve["allocation_pct"])
        assert curve["allocation_pct"][100] == pytest.approx(100 - result["unallocated_at_100"], abs=1e-3)
        assert set(result["free_at_100_pct"]) == {"idle_without_host", "idle", "partial"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@needs_trace
def test_cli_table_for_multigpu_and_default_node_lists(capsys):
    assert (
        simulator.main(
            [
                "--trace",
                str(SHARED),
                "--workload",
                "multigpu50",
                "--limit-nodes",
                "25",
                "--seeds",
                "1",
                "-s",
                "best_fit",
                "--node-list",
                "all",
                "-q",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "openb multigpu50 (all nodes), 25 nodes" in out and "best_fit" in out and "unallocated@100%" in out


def test_cli_yaml_input(tmp_path, capsys):
    nodes = "\n---\n".join(
        f"""
apiVersion: v1
kind: Node
metadata: {{name: gpu-{i}, labels: {{nvidia.com/gpu.product: A100}}}}
status:
  allocatable: {{cpu: "32", memory: 128Gi, nvidia.com/gpu: "2"}}
  conditions: [{{type: Ready, status: "True"}}]
"""
        for i in range(2)
    )
    pods = "\n---\n".join(
        [
            """
apiVersion: v1
kind: Pod
metadata: {name: whole}
spec: {containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, cpu: "4", memory: 8Gi}}}]}
""",
            """
apiVersion: v1
kind: Pod
metadata: {name: share, annotations: {agentaflow.gpu/milli: "250"}}
spec: {containers: [{name: c, image: x, resources: {requests: {cpu: "1", memory: 1Gi}}}]}
""",
        ]
    )
    (tmp_path / "nodes.yaml").write_text(nodes)
    (tmp_path / "pods.yaml").write_text(pods)
    code = simulator.main(
        [
            "--cluster",
            str(tmp_path / "nodes.yaml"),
            "--pods",
            str(tmp_path / "pods.yaml"),
            "--seeds",
            "3",
            "-s",
            "fgd",
            "-o",
            "json",
            "-q",
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu_capacity_milli"] == 4000 and doc["pods"] == 2
    assert doc["strategies"]["fgd"]["unallocated_at_100"] < 100


def test_cli_errors_are_clear(tmp_path, capsys):
    assert simulator.main(["--trace", str(tmp_path), "-q"]) == 2
    assert "workloads in" in capsys.readouterr().err
    assert simulator.main(["-s", "nosuch", "-q"]) == 2
    err = capsys.readouterr().err
    assert "'nosuch' is not a registered strategy" in err and "fgd_host" in err
    assert simulator.main(["--cluster", "x.yaml", "-q"]) == 2
    assert "--cluster and --pods go together" in capsys.readouterr().err


def test_replay_with_placements_admitted_ahead():
    # one node, 4 GPUs: the first 1-GPU pod places, two more are held ahead for its shape; the next two 1-GPU
    # pods take them; a 2-GPU pod then finds room only in what is held, which is given back first
    nodes = [NodeInfo("n", 64_000, 256_000, tuple(Device(d) for d in range(4)))]
    arrivals = [Request("a", gpus=1), Request("b", gpus=1), Request("c", gpus=2), Request("d", gpus=1)]
    plain = replay(nodes, arrivals, "best_fit", seed=0)
    ahead = replay(nodes, arrivals, "best_fit", seed=0, prefetch_depth=2)
    assert plain.allocated == ahead.allocated == [1000, 2000, 4000, 4000]
    assert (ahead.placed, ahead.failed) == (plain.placed, plain.failed) == (3, 1)


def test_placements_ahead_are_taken_in_order_and_released_on_a_denial():
    from gpuledger.core.ledger import Ledger, LedgerConfig
    from gpuledger.sim.ahead import AheadPools

    ledger = Ledger(LedgerConfig(default_strategy="best_fit"))
    ledger.upsert_node(NodeInfo("n", 64_000, 256_000, tuple(Device(d) for d in range(4))))
    pools = AheadPools(ledger, depth=2)
    first = pools.place(Request("a", gpus=1))
    assert pools.held == 2 and ledger.stats().whole_free == 1
    second = pools.place(Request("b", gpus=1))
    assert (
        pools.taken == 1 and second.id.startswith("a~ahead") and pools.held == 2
    )  # refilled from the last free
    assert not {first.devices, second.devices} - {(0,), (1,), (2,), (3,)}
    big = pools.place(Request("c", gpus=2))  # room only in what is held ahead
    assert big.devices and pools.held == 0
