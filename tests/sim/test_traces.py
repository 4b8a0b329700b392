"""The trace reader: the three openb variants, gpu_spec, YAML input and clear errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuledger.core.model import Request
from gpuledger.sim.traces import (
    TraceError,
    TracePod,
    limit_nodes,
    load_openb,
    load_yaml,
    normalise_gpu,
    parse_gpu_spec,
    read_nodes,
    read_pods,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "openb"
needs_trace = pytest.mark.skipif(not SHARED.is_dir(), reason="shared openb traces not present")

FULL = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
    """p0,12000,16384,1,1000,,LS,Running,0,12537496,0
p1,6000,12288,1,460,V100M16|V100M32,LS,Running,427061,12902960,427061
p2,88000,327680,8,1000,G2,BE,Running,1,2,1
p3,4000,8192,0,0,,BE,Running,1,2,1
"""
)
FIVE = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
q0,12000,16384,1,1000
q1,6000,12288,1,460
q2,32000,65536,4,1000
"""
NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,96000,393216,8,G2
n1,32000,262144,0,
n2,16000,122880,2,P100
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_full_variant_reads_gpu_spec_and_shares(tmp_path):
    pods = read_pods(write(tmp_path, "pods.csv", FULL))
    assert [p.name for p in pods] == ["p0", "p1", "p2", "p3"]
    assert pods[0] == TracePod("p0", 12000, 16384, 1, 1000, ())
    assert pods[1].gpu_spec == ("V100M16", "V100M32") and pods[1].is_shared and pods[1].total_gpu_milli == 460
    assert pods[2].num_gpu == 8 and pods[2].total_gpu_milli == 8000 and pods[2].gpu_spec == ("G2",)
    assert pods[3].num_gpu == 0 and pods[3].total_gpu_milli == 0


def test_five_column_variant(tmp_path):
    pods = read_pods(write(tmp_path, "pods.csv", FIVE))
    assert [(p.num_gpu, p.gpu_milli, p.gpu_spec) for p in pods] == [
        (1, 1000, ()),
        (1, 460, ()),
        (4, 1000, ()),
    ]


def test_requests_carry_share_whole_and_product_or_list(tmp_path):
    pods = read_pods(write(tmp_path, "pods.csv", FULL))
    whole, share, eight, cpu_only = (p.to_request() for p in pods)
    assert (whole.gpus, whole.gpu_milli, whole.product) == (1, 0, None)
    assert (share.gpus, share.gpu_milli, share.product) == (0, 460, "V100M16|V100M32")
    assert share.is_shared and share.cpu_milli == 6000 and share.memory_mib == 12288
    assert (eight.gpus, eight.product) == (8, "G2")
    assert not cpu_only.needs_gpu and cpu_only.cpu_milli == 4000
    assert pods[0].to_request("p0#3").id == "p0#3"


def test_gpu_spec_and_normalisation_rules():
    assert parse_gpu_spec("") == () and parse_gpu_spec(None) == ()
    assert parse_gpu_spec("A|B||C ") == ("A", "B", "C")
    assert normalise_gpu(0, 500) == (0, 0)
    assert normalise_gpu(1, 460) == (1, 460)
    assert normalise_gpu(1, 1000) == (1, 1000)
    assert normalise_gpu(1, 0) == (1, 1000)  # no milli given: a whole GPU
    assert normalise_gpu(2, 500) == (2, 1000)  # several GPUs are whole GPUs


def test_nodes_have_one_device_per_gpu(tmp_path):
    nodes = read_nodes(write(tmp_path, "nodes.csv", NODES))
    assert [len(n.devices) for n in nodes] == [8, 0, 2]
    assert nodes[0].product == "G2" and {d.product for d in nodes[0].devices} == {"G2"}
    assert nodes[1].product == "" and nodes[1].cpu_milli == 32000
    assert [d.index for d in nodes[2].devices] == [0, 1]


def test_bad_rows_name_file_line_column_and_value(tmp_path):
    bad = write(tmp_path, "bad.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,12k,1,1,1000\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: column 'cpu_milli' has '12k'"):
        read_pods(bad)
    missing = write(tmp_path, "missing.csv", "name,cpu_milli\nx,1\n")
    with pytest.raises(TraceError, match="missing column"):
        read_pods(missing)
    with pytest.raises(TraceError, match="cannot read"):
        read_pods(tmp_path / "nope.csv")


def test_unknown_workload_lists_the_ones_present(tmp_path):
    write(tmp_path, "openb_pod_list_default.csv", FIVE)
    write(tmp_path, "openb_node_list_gpu_node.csv", NODES)
    nodes, pods = load_openb(tmp_path, "default", "gpu")
    assert len(nodes) == 3 and len(pods) == 3
    with pytest.raises(TraceError, match=r"workloads in .*: default"):
        load_openb(tmp_path, "nosuch", "gpu")
    with pytest.raises(TraceError, match="accepted: gpu, all"):
        load_openb(tmp_path, "default", "cpu")


def test_limit_nodes_spreads_over_the_list(tmp_path):
    nodes = read_nodes(write(tmp_path, "nodes.csv", NODES))
    assert [n.name for n in limit_nodes(nodes, 2)] == ["n0", "n1"]
    assert limit_nodes(nodes, 0) == nodes and limit_nodes(nodes, 10) == nodes


@needs_trace
@pytest.mark.parametrize(
    "workload,count,columns_with_spec",
    [("default", 8152, True), ("multigpu50", 9061, False), ("gpushare40", 8152, True)],
)
def test_the_shared_openb_variants(workload, count, columns_with_spec):
    nodes, pods = load_openb(SHARED, workload, "gpu")
    assert len(pods) == count
    assert len(nodes) == 1213 and sum(len(n.devices) for n in nodes) == 6212
    assert all(p.num_gpu == 0 or p.gpu_milli == 1000 or p.num_gpu == 1 for p in pods)
    all_nodes, _ = load_openb(SHARED, workload, "all")
    assert len(all_nodes) == 1523 and sum(len(n.devices) for n in all_nodes) == 6212
    header = (SHARED / f"openb_pod_list_{workload}.csv").read_text().splitlines()[0]
    assert ("gpu_spec" in header) == columns_with_spec


CLUSTER_YAML = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: gpu-a
    labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB}
  status:
    capacity: {cpu: "32", memory: 256Gi, nvidia.com/gpu: "4"}
    allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu: "4"}
    conditions: [{type: Ready, status: "True"}]
"""
PODS_YAML = """
apiVersion: v1
kind: Pod
metadata: {name: whole}
spec:
  containers:
  - name: c
    image: x
    resources:
      limits: {nvidia.com/gpu: 2, cpu: "4", memory: 8Gi}
---
apiVersion: v1
kind: Pod
metadata:
  name: share
  annotations: {agentaflow.gpu/milli: "300", agentaflow.gpu/product: A100}
spec:
  containers:
  - {name: c, image: x, resources: {requests: {cpu: 500m, memory: 1Gi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: cpu-only}
spec:
  containers:
  - {name: c, image: x, resources: {requests: {cpu: "2", memory: 2Gi}}}
"""


def test_yaml_cluster_and_pods(tmp_path):
    pytest.importorskip("gpuledger.core.pods.objects")
    nodes, requests = load_yaml(
        write(tmp_path, "cluster.yaml", CLUSTER_YAML), write(tmp_path, "pods.yaml", PODS_YAML)
    )
    assert [n.name for n in nodes] == ["gpu-a"] and len(nodes[0].devices) == 4
    whole, share, cpu_only = requests
    assert (
        isinstance(whole, Request)
        and whole.gpus == 2
        and whole.cpu_milli == 4000
        and whole.memory_mib == 8192
    )
    assert share.gpu_milli == 300 and share.product == "A100" and share.cpu_milli == 500
    assert not cpu_only.needs_gpu and cpu_only.cpu_milli == 2000


def test_yaml_errors_are_clear(tmp_path):
    pytest.importorskip("gpuledger.core.pods.objects")
    with pytest.raises(TraceError, match="no objects of kind Node"):
        load_yaml(
            write(tmp_path, "c.yaml", "kind: Pod\nmetadata: {name: x}\n"),
            write(tmp_path, "p.yaml", PODS_YAML),
        )
    bad = textwrap.dedent("""
        kind: Pod
        metadata: {name: bad, annotations: {agentaflow.gpu/milli: "lots"}}
        spec: {containers: [{name: c, image: x}]}
    """)
    with pytest.raises(TraceError, match=r"agentaflow\.gpu/milli"):
        load_yaml(write(tmp_path, "c.yaml", CLUSTER_YAML), write(tmp_path, "p.yaml", bad))
