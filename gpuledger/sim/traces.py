"""Workloads for `gpuledger simulate`: the openb CSV traces and Node/Pod YAML, read into the core's types.

A trace row becomes a `NodeInfo` or a `TracePod`; a `TracePod` becomes a core `Request`, so that the
simulator drives the very same `Ledger.reserve` the webhook does. Reading is strict: a malformed row
raises `TraceError` naming the file, the line, the column and the value, never a bare `ValueError`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuledger.core.model import MILLI_PER_GPU, Device, NodeInfo, Request

WORKLOADS = ("default", "multigpu50", "gpushare40")
NODE_LISTS = {"gpu": "openb_node_list_gpu_node.csv", "all": "openb_node_list_all_node.csv"}
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec etc. are optional


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line, column and value."""


@dataclass(frozen=True)
class TracePod:
    """One pod of a trace. `gpu_milli` is per GPU: 1000 for whole GPUs, 1..999 for a share of one GPU."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: tuple[str, ...] = ()  # allowed GPU models (any of them); empty = any model

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def is_shared(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI_PER_GPU

    def to_request(self, request_id: str | None = None, seed: int = 0) -> Request:
        shared = self.is_shared
        return Request(
            id=request_id or self.name,
            name=self.name,
            gpus=0 if shared else self.num_gpu,
            gpu_milli=self.gpu_milli if shared else 0,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            product="|".join(self.gpu_spec) or None,
            seed=seed,
        )


def parse_gpu_spec(text: str | None) -> tuple[str, ...]:
    """`V100M16|V100M32` -> ("V100M16", "V100M32"); empty or missing -> () (any model)."""
    if not text:
        return ()
    return tuple(part.strip() for part in text.split("|") if part.strip())


def normalise_gpu(num_gpu: int, gpu_milli: int) -> tuple[int, int]:
    """The trace's (num_gpu, gpu_milli) as (GPUs, per-GPU milli): a share only for one GPU below 1000."""
    if num_gpu <= 0:
        return 0, 0
    if num_gpu == 1 and 0 < gpu_milli < MILLI_PER_GPU:
        return 1, gpu_milli
    return num_gpu, MILLI_PER_GPU  # several GPUs, or a milli of 0/1000+, are whole GPUs


def _int(path: Path, line: int, column: str, value: str | None) -> int:
    try:
        number = int(float(value)) if value not in (None, "") else 0
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column!r} has {value!r}; expected an integer") from None
    if number < 0:
        raise TraceError(f"{path}:{line}: column {column!r} has {value!r}; expected a non-negative integer")
    return number


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    # opened outside the `with` so that only the open's OSError becomes a TraceError, not one from a row
    try:
        handle = open(path, newline="")  # noqa: SIM115  (closed by the `with` below)
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(
                f"{path}: missing column(s) {', '.join(missing)}; header is "
                f"{','.join(reader.fieldnames or [])!r}, expected at least {','.join(required)}"
            )
        yield from enumerate(reader, start=2)


def read_nodes(path: str | Path) -> list[NodeInfo]:
    """A node list CSV (`sn,cpu_milli,memory_mib,gpu,model`) as NodeInfo, one Device per GPU."""
    path = Path(path)
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        name = (row["sn"] or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: column 'sn' is empty; expected a node name")
        model = (row.get("model") or "").strip()
        gpus = _int(path, line, "gpu", row["gpu"])
        devices = tuple(Device(index=i, uuid=f"{name}-gpu{i}", product=model) for i in range(gpus))
        nodes.append(
            NodeInfo(
                name=name,
                cpu_milli=_int(path, line, "cpu_milli", row["cpu_milli"]),
                memory_mib=_int(path, line, "memory_mib", row["memory_mib"]),
                devices=devices,
                product=model if gpus else "",
            )
        )
    return nodes


def read_pods(path: str | Path) -> list[TracePod]:
    """A pod list CSV; only the first five columns are required, `gpu_spec` is read when present."""
    path = Path(path)
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        name = (row["name"] or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: column 'name' is empty; expected a pod name")
        num_gpu, gpu_milli = normalise_gpu(
            _int(path, line, "num_gpu", row["num_gpu"]), _int(path, line, "gpu_milli", row["gpu_milli"])
        )
        pods.append(
            TracePod(
                name=name,
                cpu_milli=_int(path, line, "cpu_milli", row["cpu_milli"]),
                memory_mib=_int(path, line, "memory_mib", row["memory_mib"]),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=parse_gpu_spec(row.get("gpu_spec")) if num_gpu else (),
            )
        )
    return pods


def openb_paths(trace_dir: str | Path, workload: str, node_list: str) -> tuple[Path, Path]:
    """The (node file, pod file) of an openb workload, with a clear error naming what exists."""
    trace_dir = Path(trace_dir)
    if node_list not in NODE_LISTS:
        raise TraceError(f"--node-list {node_list!r} is not known; accepted: {', '.join(NODE_LISTS)}")
    pod_file = trace_dir / f"openb_pod_list_{workload}.csv"
    if not pod_file.is_file():
        found = sorted(p.name[len("openb_pod_list_") : -4] for p in trace_dir.glob("openb_pod_list_*.csv"))
        raise TraceError(
            f"--workload {workload!r}: no {pod_file}; workloads in {trace_dir}: {', '.join(found) or 'none'}"
        )
    return trace_dir / NODE_LISTS[node_list], pod_file


def load_openb(
    trace_dir: str | Path, workload: str = "default", node_list: str = "gpu"
) -> tuple[list[NodeInfo], list[TracePod]]:
    node_file, pod_file = openb_paths(trace_dir, workload, node_list)
    return read_nodes(node_file), read_pods(pod_file)


def limit_nodes(nodes: Sequence[NodeInfo], count: int) -> list[NodeInfo]:
    """`count` nodes spread evenly over the list, so that a small test cluster keeps the trace's mix."""
    if count <= 0 or count >= len(nodes):
        return list(nodes)
    step = len(nodes) / count
    return [nodes[int(i * step)] for i in range(count)]


# --- Node/Pod YAML -------------------------------------------------------------------------------------


def read_yaml_objects(path: str | Path) -> list[dict]:
    """Every object of a multi-document YAML file, `kind: List` items unrolled."""
    import yaml  # only the YAML input path needs it

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise TraceError(f"{path}: not valid YAML: {exc}") from None
    objects: list[dict] = []
    for doc in documents:
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise TraceError(f"{path}: a document is a {type(doc).__name__}; expected a Kubernetes object")
        if doc.get("kind", "").endswith("List") and isinstance(doc.get("items"), list):
            objects.extend(item for item in doc["items"] if isinstance(item, dict))
        else:
            objects.append(doc)
    return objects


def node_from_yaml(obj: dict) -> NodeInfo:
    """A Node object as NodeInfo, through the core's parser so that labels, taints and devices agree."""
    from gpuledger.core.pods import objects as kube  # the core's one Node parser

    return kube.node_from_object(obj)


def request_from_yaml(obj: dict, index: int) -> Request:
    """A Pod object as the Request the webhook would make (same annotations, same parser).

    A pod that needs no GPU still takes CPU and memory on its node, so it becomes a CPU-only Request.
    """
    from gpuledger.core.pods import pod_spec
    from gpuledger.core.pods import request as pod_request  # the webhook's pure pod -> Request parser

    meta = obj.get("metadata") or {}
    request_id = str(meta.get("name") or f"pod-{index}")
    try:
        request = pod_request.request_from_pod(obj, None, reservation_id=request_id)
        if request is not None:
            return request
        cpu_milli, memory_mib = pod_spec.container_resources(obj)
    except pod_request.AnnotationError as exc:
        raise TraceError(f"pod {request_id!r}: {exc}") from None
    return Request(id=request_id, name=request_id, cpu_milli=cpu_milli, memory_mib=memory_mib)


def load_yaml(cluster_file: str | Path, pods_file: str | Path) -> tuple[list[NodeInfo], list[Request]]:
    nodes = [node_from_yaml(o) for o in read_yaml_objects(cluster_file) if o.get("kind") == "Node"]
    if not nodes:
        raise TraceError(
            f"--cluster {cluster_file}: no objects of kind Node; expected Node objects "
            f"(e.g. `kubectl get nodes -o yaml`)"
        )
    objects = [o for o in read_yaml_objects(pods_file) if o.get("kind") == "Pod"]
    pods = [request_from_yaml(o, i) for i, o in enumerate(objects)]
    if not pods:
        raise TraceError(f"--pods {pods_file}: no objects of kind Pod; expected Pod objects")
    return nodes, pods
