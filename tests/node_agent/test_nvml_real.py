"""The NVML path on a real GPU: the probe's devices and processes, the agent's annotations, the ledger's
choice reaching CUDA as the device NVML named, and an XID the driver raises reaching the agent as an event.

These run only where NVML answers (a GPU node; the project's lent GPU machine, see docs/node-agent.md for the
last run and its figures), on GPUs no other process uses meanwhile (an outside process holding over
`external_memory_threshold_mib` would keep the ledger off its device). Everywhere else they skip, and the
same paths are driven through `FakeProbe`, which answers the same `GpuProbe` protocol
(tests/node_agent/test_node_agent*.py, tests/e2e/test_real_node_*).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, Placement, Reason, Request
from gpuledger.names import DEVICES_ANNOTATION, HOLDERS_ANNOTATION, XIDS_ANNOTATION
from gpuledger.node_agent.agent import NodeAgent
from gpuledger.node_agent.pod_resources import PodResourcesClient
from gpuledger.node_agent.probes import GpuProcess, NvmlProbe, ProbeError
from gpuledger.node_agent.processes import external_usage
from gpuledger.node_agent.xids import APPLICATION_XIDS
from gpuledger.webhook.admission.patch import visibility_env
from tests.node_agent.node_store import NodeStore

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
HOLD_MIB = 2048  # over the ledger's default external_memory_threshold_mib (1024)
DEADLINE_S = 60.0  # for the driver to list a new process: an event waited on, not a TTL

# Holds HOLD_MIB of device memory on the device CUDA_VISIBLE_DEVICES names, prints that device's UUID and
# waits for its stdin to close.
HOLDER = """
import sys
mib = int(sys.argv[1])
try:
    import torch
    x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    uuid = str(torch.cuda.get_device_properties(0).uuid)
except ImportError:
    import cupy
    x = cupy.empty(mib << 20, dtype=cupy.uint8)
    cupy.cuda.runtime.deviceSynchronize()
    uuid = cupy.cuda.runtime.getDeviceProperties(0)["uuid"].hex()
print(uuid, flush=True)
sys.stdin.read()
"""

# Keeps the GPU busy with matrix products until its stdin closes.
BUSY = """
import sys, threading, torch
a = torch.randn(8192, 8192, device="cuda")
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("busy", flush=True)
while not stop.is_set():
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
"""


# Makes an illegal memory access on the GPU CUDA_VISIBLE_DEVICES names: the driver raises an XID (an MMU
# fault, 31 on an H100) for the context, and the GPU itself stays healthy.
FAULT = """
import cupy
kernel = cupy.RawKernel(r'extern "C" __global__ void k() { *(volatile int*)0x8 = 1; }', "k")
try:
    kernel((1,), (1,), ())
    cupy.cuda.runtime.deviceSynchronize()
    print("no fault", flush=True)
except Exception as exc:
    print(type(exc).__name__, exc, flush=True)
"""


@pytest.fixture(scope="module")
def probe() -> Iterator[NvmlProbe]:
    try:
        real = NvmlProbe()
    except ProbeError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    yield real
    real.close()


@pytest.fixture(scope="module")
def cuda() -> None:
    if not (importlib.util.find_spec("torch") or importlib.util.find_spec("cupy")):
        pytest.skip("a CUDA process needs torch or cupy, and neither is installed")


def bare_uuid(text: str) -> str:
    """NVML says `GPU-<uuid>`; torch and cupy give the bare UUID (with or without dashes)."""
    text = text.strip().lower()
    return text.removeprefix("gpu-").replace("-", "")


def cuda_process(script: str, visible: str, *args: str) -> tuple[subprocess.Popen, str]:
    """`script` run on the GPU `visible` names (CUDA_VISIBLE_DEVICES), and the first line it prints once
    ready; it runs until its stdin closes (`release`)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=visible),
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip()
    assert ready, f"the CUDA process printed nothing (exit {proc.poll()})"
    return proc, ready


def hold_memory(mib: int, visible: str) -> tuple[subprocess.Popen, str]:
    """The holder process, and the UUID of the device it holds memory on."""
    return cuda_process(HOLDER, visible, str(mib))


def release(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)


def wait_for(probe: NvmlProbe, found) -> list[GpuProcess]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        listed = probe.processes()
        if found(listed) or time.monotonic() > deadline:
            return listed
        time.sleep(0.2)


def agent_patch(tmp_path: Path) -> dict:
    """`gpuledger node-agent --print` with real NVML and no kubelet socket (holders unknown)."""
    out = subprocess.run(
        [sys.executable, "-m", "gpuledger.node_agent", "--node", "gpu-node", "--print",
         "--pod-resources-socket", str(tmp_path / "no-kubelet.sock")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def node_object(patch: dict, name: str = "gpu-node") -> dict:
    """The Node as the API server would hold it after the agent's patch (no device plugin: runtime-uuids)."""
    meta = patch["metadata"]
    gpus = meta["labels"]["agentaflow.gpu/count"]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": dict(meta["labels"]),
            "annotations": dict(meta["annotations"]),
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": gpus, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_devices_are_what_nvidia_smi_reports(probe):
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    expected = [[cell.strip() for cell in line.split(",")] for line in smi.strip().splitlines()]
    reports = probe.devices()
    assert [[str(r.index), r.uuid, r.product, str(r.memory_mib)] for r in reports] == expected
    assert all(r.healthy for r in reports), [r.reason for r in reports if not r.healthy]
    assert all(0 <= r.utilization_pct <= 100 for r in reports)


def test_a_cuda_process_is_listed_on_its_device_and_counted_as_external(probe, cuda):
    device = probe.devices()[0]
    holder, held_uuid = hold_memory(HOLD_MIB, device.uuid)
    try:
        assert bare_uuid(held_uuid) == bare_uuid(device.uuid)
        listed = wait_for(probe, lambda ps: any(p.pid == holder.pid for p in ps))
        mine = [p for p in listed if p.pid == holder.pid]
        assert mine, f"NVML lists {listed} on the GPUs, not the holder's pid {holder.pid}"
        assert [p.device for p in mine] == [device.index]
        assert mine[0].used_memory_mib >= HOLD_MIB
        # its cgroup names no pod: memory the ledger did not hand out
        external = external_usage(mine)
        assert external[str(device.index)]["pids"] == [holder.pid]
        assert external[str(device.index)]["memoryMiB"] >= HOLD_MIB
    finally:
        release(holder)
    gone = wait_for(probe, lambda ps: all(p.pid != holder.pid for p in ps))
    assert all(p.pid != holder.pid for p in gone)


def test_the_ledger_keeps_off_a_device_an_outside_process_fills_and_places_on_it_once_freed(
    probe, cuda, tmp_path
):
    config = LedgerConfig(placement_key=b"gpu-test-key")
    devices = probe.devices()
    target = devices[0]
    holder, _ = hold_memory(HOLD_MIB, target.uuid)
    try:
        wait_for(probe, lambda ps: any(p.pid == holder.pid for p in ps))
        patch = agent_patch(tmp_path)
    finally:
        release(holder)
    annotations = patch["metadata"]["annotations"]
    published = json.loads(annotations[DEVICES_ANNOTATION])
    assert [(d["index"], d["uuid"], d["product"]) for d in published] == [
        (r.index, r.uuid, r.product) for r in devices
    ]
    truth = json.loads(annotations[HOLDERS_ANNOTATION])
    assert truth["source"] == "unavailable" and truth["holders"] == {}
    assert holder.pid in truth["external"][str(target.index)]["pids"]

    busy = Ledger.rebuild([node_object(patch)], config)
    answers = [busy.reserve(Request(f"r{i}", gpus=1), 0.0) for i in range(len(devices))]
    placed = [a for a in answers if isinstance(a, Placement)]
    assert target.index not in {d for p in placed for d in p.devices}
    denial = answers[-1]
    assert isinstance(denial, Denial) and dict(denial.by_reason) == {Reason.EXTERNAL_GPU_USE: 1}
    assert f"device {target.index}" in denial.message and HOLDERS_ANNOTATION in denial.message

    freed = wait_for(probe, lambda ps: all(p.pid != holder.pid for p in ps))
    assert all(p.pid != holder.pid for p in freed)
    idle = Ledger.rebuild([node_object(agent_patch(tmp_path))], config)
    placement = idle.reserve(Request("r", gpus=len(devices)), 0.0)
    assert isinstance(placement, Placement), placement
    assert placement.uuids == tuple(devices[i].uuid for i in placement.devices)

    # what the pod's container gets (runtime-uuids, the shipped mode) selects exactly that GPU in CUDA
    one = idle.reserve(Request("r-next", gpus=1), 0.0)
    assert isinstance(one, Denial)  # every device is now the first reservation's
    idle.release("r")
    one = idle.reserve(Request("r-one", gpus=1), 0.0)
    assert isinstance(one, Placement) and one.devices == (target.index,)
    env = visibility_env(one, "runtime-uuids")
    visible = env["NVIDIA_VISIBLE_DEVICES"]
    assert visible == target.uuid and env["CUDA_VISIBLE_DEVICES"] == "0"
    inside, seen_uuid = hold_memory(1, str(visible))  # the runtime exposes only that GPU
    release(inside)
    assert bare_uuid(seen_uuid) == bare_uuid(target.uuid)


def test_a_busy_gpu_reads_high_and_least_utilized_places_on_the_node_measured_idle(probe, tmp_path):
    if not importlib.util.find_spec("torch"):
        pytest.skip("the busy loop needs torch")
    target = probe.devices()[0]
    busy, _ = cuda_process(BUSY, target.uuid)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while probe.devices()[0].utilization_pct < 90 and time.monotonic() < deadline:
            time.sleep(0.2)
        measured_busy = agent_patch(tmp_path)
    finally:
        release(busy)
    labels = measured_busy["metadata"]["labels"]
    busy_devices = json.loads(measured_busy["metadata"]["annotations"][DEVICES_ANNOTATION])
    assert busy_devices[0]["utilization"] >= 70, busy_devices
    if len(busy_devices) == 1:  # the tier is the mean over the node's GPUs
        assert labels["agentaflow.gpu/utilization-tier"] == "high"

    deadline = time.monotonic() + DEADLINE_S
    while probe.devices()[0].utilization_pct > 10 and time.monotonic() < deadline:
        time.sleep(0.2)
    measured_idle = agent_patch(tmp_path)
    idle_devices = json.loads(measured_idle["metadata"]["annotations"][DEVICES_ANNOTATION])
    assert idle_devices[0]["utilization"] <= 10, idle_devices

    # the same GPU measured twice, as two nodes: the fresh measurements steer the placement
    ledger = Ledger.rebuild(
        [node_object(measured_busy, "measured-busy"), node_object(measured_idle, "measured-idle")],
        LedgerConfig(placement_key=b"gpu-test-key"),
    )
    # every GPU of the node, so that on a node of several the busy one is among those scored
    devices = probe.devices()
    every = Request("r", gpus=len(devices), strategy="least_utilized")
    placement = ledger.reserve(every, time.time())
    assert isinstance(placement, Placement) and placement.node == "measured-idle"
    assert placement.uuids == tuple(devices[i].uuid for i in placement.devices)
    assert target.index in placement.devices


def fault(visible: str) -> str:
    if not importlib.util.find_spec("cupy"):
        pytest.skip("the faulting kernel needs cupy")
    out = subprocess.run(
        [sys.executable, "-c", FAULT], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=visible),
    )  # fmt: skip
    assert "illegal" in out.stdout.lower(), (out.stdout, out.stderr)
    return out.stdout


def quiet_agent(probe: NvmlProbe, store: NodeStore, tmp_path: Path, **kwargs) -> NodeAgent:
    no_kubelet = PodResourcesClient(tmp_path / "no-kubelet.sock", 1.0)
    agent = NodeAgent("gpu-node", probe, store, pod_resources=no_kubelet, **kwargs)
    probe.xid_events()  # what earlier tests left
    agent.publish_once()
    return agent


def test_an_xid_the_driver_raises_reaches_the_agent_which_keeps_the_gpu_off_when_told_to(probe, tmp_path):
    """`--ignore-xids none`: even an application's fault marks the GPU, which then gets no placements."""
    devices = probe.devices()
    target = devices[0]
    store = NodeStore()
    strict = quiet_agent(probe, store, tmp_path, ignored_xids=frozenset())
    fault(target.uuid)
    deadline = time.monotonic() + DEADLINE_S
    patch = strict.publish_if_changed()
    while patch is None and time.monotonic() < deadline:
        time.sleep(0.2)
        patch = strict.publish_if_changed()
    assert patch is not None, "no XID event reached the agent"
    record = json.loads(store.annotations[XIDS_ANNOTATION])
    assert list(record["devices"]) == [target.uuid]
    (error,) = record["devices"][target.uuid]
    assert error["xid"] in APPLICATION_XIDS  # so the shipped default forgives it (next test)
    published = json.loads(patch["metadata"]["annotations"][DEVICES_ANNOTATION])
    assert not published[0]["healthy"] and f"critical XID {error['xid']}" in published[0]["reason"]
    assert all(r.healthy for r in probe.devices())  # NVML itself: the GPU is fine

    ledger = Ledger.rebuild([node_object(patch)], LedgerConfig(placement_key=b"gpu-test-key"))
    denial = ledger.reserve(Request("every", gpus=len(devices)), 0.0)
    # a node whose every GPU is unhealthy is labelled not schedulable for GPUs (a one-GPU machine)
    why = Reason.NOT_GPU_SCHEDULABLE if len(devices) == 1 else Reason.UNHEALTHY_DEVICE
    assert isinstance(denial, Denial) and dict(denial.by_reason) == {why: 1}
    # the operator clears the record (the GPU needs no reset: the fault was the application's)
    store.annotate(XIDS_ANNOTATION, None)
    cleared = strict.publish_once()
    assert all(d["healthy"] for d in json.loads(cleared["metadata"]["annotations"][DEVICES_ANNOTATION]))


def test_by_default_an_applications_fault_leaves_the_gpu_healthy_and_sends_nothing(probe, tmp_path, caplog):
    target = probe.devices()[0]
    store = NodeStore()
    agent = quiet_agent(probe, store, tmp_path)
    caplog.set_level("INFO", logger="gpuledger.node_agent")
    fault(target.uuid)
    deadline = time.monotonic() + DEADLINE_S
    sent = []
    while "an application's fault" not in caplog.text and time.monotonic() < deadline:
        sent.append(agent.publish_if_changed())
        time.sleep(0.2)
    assert f"on GPU {target.index}: an application's fault" in caplog.text, "no XID event reached the agent"
    assert sent == [None] * len(sent) and len(store.patches) == 1
    forgiven = re.search(r"XID (\d+) on GPU (\d+): an application's fault", caplog.text)
    assert forgiven and int(forgiven[1]) in APPLICATION_XIDS and int(forgiven[2]) == target.index
    published = agent.publish_once()["metadata"]["annotations"][DEVICES_ANNOTATION]
    assert all(d["healthy"] for d in json.loads(published))
