"""`agentaflow.gpu/device-holders`: who holds each GPU per the kubelet's PodResources API, and which GPUs hold
memory of processes outside Kubernetes, in the exact wire format the ledger reads.

The kubelet is stood in for by a real gRPC server on a unix socket speaking the vendored PodResources v1 API;
the GPU is the fake probe (no GPU here).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest

from gpuledger.names import HOLDERS_ANNOTATION
from gpuledger.node_agent import kubelet_grpc
from gpuledger.node_agent.agent import NodeAgent, main, node_patch
from gpuledger.node_agent.holders import DeviceHolders, observe
from gpuledger.node_agent.pod_resources import Holding, PodResourcesClient, device_index, map_holders
from gpuledger.node_agent.probes import DeviceReport, FakeProbe, GpuProcess
from gpuledger.node_agent.processes import external_usage, pod_uid_in
from tests.node_agent.node_store import NodeStore

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
UID = "3f0c8a52-1b2d-4e6f-8a9b-0c1d2e3f4a5b"
REPORTS = [DeviceReport(i, f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd", "H100", 81559, True) for i in range(4)]


# ---------------------------------------------------------------- cgroups: which pid is in a pod
@pytest.mark.parametrize(
    "cgroup",
    [
        f"0::/kubepods/burstable/pod{UID}/0123456789abcdef\n",  # cgroupfs driver, cgroup v2
        f"12:memory:/kubepods/besteffort/pod{UID}/abc\n11:cpu:/kubepods/besteffort/pod{UID}/abc\n",  # v1
        f"0::/gpuledger-real-node-0/kubepods/pod{UID}/abc\n",  # a kubelet with --cgroup-root (devcluster)
        f"0::/kubepods/pod{UID}\n",  # the pod's own cgroup
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        + UID.replace("-", "_")
        + ".slice/cri-containerd-0123abcd.scope\n",  # systemd driver
        "0::/kubepods.slice/kubepods-pod" + UID.replace("-", "_") + ".slice/cri-containerd-0123.scope\n",
    ],
)
def test_a_pod_cgroup_names_the_pod_uid(cgroup):
    assert pod_uid_in(cgroup) == UID


def test_a_static_pod_uid_is_its_32_hex_config_hash():
    assert pod_uid_in("0::/kubepods/burstable/pod5f3b0c1d2e3f4a5b6c7d8e9f0a1b2c3d/abc\n") == (
        "5f3b0c1d2e3f4a5b6c7d8e9f0a1b2c3d"
    )


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/docker-0123456789abcdef.scope\n",
        "0::/\n",
        "0::/kubepods/burstable/podnot-a-uid/abc\n",
        "",
    ],
)
def test_a_cgroup_outside_kubernetes_names_no_pod(cgroup):
    assert pod_uid_in(cgroup) is None


def _proc(tmp_path: Path, cgroups: dict[int, str]) -> Path:
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return tmp_path


def test_external_memory_sums_per_device_the_processes_in_no_pod(tmp_path):
    proc_root = _proc(
        tmp_path,
        {
            100: f"0::/kubepods/burstable/pod{UID}/c1\n",  # in a pod: not external
            200: "0::/user.slice/user-1000.slice/session-3.scope\n",
            300: "0::/system.slice/docker-0123.scope\n",
        },
    )
    processes = [
        GpuProcess(0, 100, 4000),
        GpuProcess(1, 300, 256),
        GpuProcess(1, 200, 512),
        GpuProcess(2, 999, 1024),  # its /proc entry is gone (or in another pid namespace): not guessed
    ]
    assert external_usage(processes, proc_root) == {"1": {"memoryMiB": 768, "pids": [200, 300]}}


# ---------------------------------------------------------------- kubelet device ids -> probed devices
def test_device_ids_map_by_uuid_replica_and_index():
    assert device_index(REPORTS[2].uuid, REPORTS) == 2
    assert device_index(REPORTS[3].uuid + "::1", REPORTS) == 3  # a time-sliced replica
    assert device_index("1", REPORTS) == 1  # --device-id-strategy=index
    assert device_index("GPU-unknown", REPORTS) is None
    assert device_index("7", REPORTS) is None


def test_holders_are_sorted_deduplicated_and_only_of_the_gpu_resources():
    holdings = [
        Holding("team-b", "train", "main", "nvidia.com/gpu", (REPORTS[1].uuid, REPORTS[0].uuid)),
        Holding("team-a", "serve", "sidecar", "nvidia.com/gpu", (REPORTS[1].uuid + "::0",)),
        Holding("team-a", "serve", "main", "nvidia.com/gpu", (REPORTS[1].uuid + "::1", "GPU-elsewhere")),
        Holding("team-a", "nic", "main", "example.com/rdma", ("mlx5_0",)),
    ]
    holders, unmapped = map_holders(holdings, REPORTS, allocatable={"nvidia.com/gpu": ("GPU-spare",)})
    assert holders == {
        "0": [{"namespace": "team-b", "pod": "train", "container": "main"}],
        "1": [
            {"namespace": "team-a", "pod": "serve", "container": "main"},
            {"namespace": "team-a", "pod": "serve", "container": "sidecar"},
            {"namespace": "team-b", "pod": "train", "container": "main"},
        ],
    }
    assert unmapped == ["GPU-elsewhere", "GPU-spare"]
    rdma, _ = map_holders(holdings, REPORTS, resources=("example.com/rdma",))
    assert rdma == {}  # its ids are no GPU's


def test_annotation_is_compact_sorted_json_in_the_wire_format():
    holders = DeviceHolders(
        "podresources",
        holders={"10": [{"namespace": "ns", "pod": "p", "container": "c"}], "2": []},
        external={"1": {"pids": [7], "memoryMiB": 512}},
        unmapped=["GPU-x"],
    )
    assert holders.annotation() == (
        '{"external":{"1":{"memoryMiB":512,"pids":[7]}},'
        '"holders":{"10":[{"container":"c","namespace":"ns","pod":"p"}],"2":[]},'
        '"source":"podresources","unmapped":["GPU-x"],"v":1}'
    )
    assert DeviceHolders("unavailable").annotation() == (
        '{"external":{},"holders":{},"source":"unavailable","unmapped":[],"v":1}'
    )
    patch = node_patch(REPORTS, NOW, holders)
    assert patch["metadata"]["annotations"][HOLDERS_ANNOTATION] == holders.annotation()
    assert HOLDERS_ANNOTATION not in node_patch(REPORTS, NOW)["metadata"]["annotations"]


# ---------------------------------------------------------------- the fake probe's processes
def test_fake_probe_object_spec_carries_processes():
    spec = json.dumps({"gpus": "2xT4:15360", "processes": [[1, 4242, 300]]})
    probe = FakeProbe.from_spec(spec)
    assert [r.index for r in probe.devices()] == [0, 1]
    assert probe.processes() == [GpuProcess(1, 4242, 300)]
    listed = FakeProbe.from_spec(json.dumps({"gpus": [{**REPORTS[0].__dict__}]}))
    assert listed.devices() == [REPORTS[0]] and listed.processes() == []


@pytest.mark.parametrize("spec", ['{"processes": []}', '{"gpus": "1xT4:1", "procs": []}'])
def test_bad_fake_object_spec_names_the_keys_accepted(spec):
    with pytest.raises(ValueError, match="needs gpus"):
        FakeProbe.from_spec(spec)


def test_bad_fake_processes_name_the_form():
    with pytest.raises(ValueError, match=r"\[\[INDEX, PID, MIB\]"):
        FakeProbe.from_spec('{"gpus": "1xT4:1", "processes": [[0, 1]]}')


# ---------------------------------------------------------------- the client, over a real gRPC socket
class Kubelet:
    """The kubelet's PodResourcesLister on a unix socket, answering what the test sets (no Get)."""

    def __init__(self, socket: Path):
        self.api = kubelet_grpc.load()
        self.Get = self.api.podresources_grpc.PodResourcesListerServicer().Get
        self.socket, self.pods, self.allocatable, self.delay = socket, [], [], 0.0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.api.podresources_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")

    def hold(self, namespace: str, pod: str, container: str, ids: list[str], resource="nvidia.com/gpu"):
        pr = self.api.podresources
        devices = [pr.ContainerDevices(resource_name=resource, device_ids=ids)]
        self.pods.append(
            pr.PodResources(
                name=pod,
                namespace=namespace,
                containers=[pr.ContainerResources(name=container, devices=devices)],
            )
        )

    def List(self, request, context):
        time.sleep(self.delay)
        return self.api.podresources.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request, context):
        devices = [
            self.api.podresources.ContainerDevices(
                resource_name="nvidia.com/gpu", device_ids=self.allocatable
            )
        ]
        return self.api.podresources.AllocatableResourcesResponse(devices=devices)


@pytest.fixture
def kubelet():
    folder = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))  # unix socket paths are short
    served = Kubelet(folder / "kubelet.sock")
    served.server.start()
    yield served
    served.server.stop(grace=0).wait(5)


def test_client_lists_holdings_and_allocatable_ids(kubelet):
    kubelet.hold("ns", "p", "c", [REPORTS[0].uuid, REPORTS[2].uuid])
    kubelet.hold("ns", "idle", "c", [])
    kubelet.allocatable = [r.uuid for r in REPORTS]
    client = PodResourcesClient(kubelet.socket, timeout_s=5)
    assert client.list() == [Holding("ns", "p", "c", "nvidia.com/gpu", (REPORTS[0].uuid, REPORTS[2].uuid))]
    assert client.allocatable() == {"nvidia.com/gpu": tuple(r.uuid for r in REPORTS)}


def test_missing_socket_or_silent_kubelet_gives_unavailable_not_a_crash(kubelet, tmp_path):
    probe = FakeProbe(REPORTS)
    missing = observe(REPORTS, probe, PodResourcesClient(tmp_path / "no.sock"))
    assert missing == DeviceHolders("unavailable")
    kubelet.delay = 1.0
    started = time.monotonic()
    slow = observe(REPORTS, probe, PodResourcesClient(kubelet.socket, timeout_s=0.2))
    assert slow.source == "unavailable" and time.monotonic() - started < 1.0


def test_agent_patches_when_holders_change_and_a_restart_publishes_the_same(kubelet, tmp_path):
    proc_root = _proc(tmp_path, {500: "0::/user.slice/session-1.scope\n"})
    probe = FakeProbe(REPORTS, [GpuProcess(3, 500, 2048)])
    api = NodeStore()

    def agent():
        return NodeAgent(
            "n1", probe, api, pod_resources=PodResourcesClient(kubelet.socket), proc_root=proc_root
        )

    first = agent()
    first.publish_once(NOW)
    assert first.publish_if_changed(NOW) is None and len(api.patches) == 1  # nothing changed: nothing sent
    kubelet.hold("ns", "p", "c", [REPORTS[1].uuid])
    changed = first.publish_if_changed(NOW)
    assert changed is not None and len(api.patches) == 2
    text = changed["metadata"]["annotations"][HOLDERS_ANNOTATION]
    assert json.loads(text) == {
        "v": 1,
        "source": "podresources",
        "holders": {"1": [{"namespace": "ns", "pod": "p", "container": "c"}]},
        "external": {"3": {"memoryMiB": 2048, "pids": [500]}},
        "unmapped": [],
    }
    restarted = agent()  # a new process: nothing carried over
    assert restarted.publish_once(NOW)["metadata"]["annotations"][HOLDERS_ANNOTATION] == text


def test_run_loop_patches_holder_changes_between_full_publications(kubelet):
    clock = [0.0]
    api = NodeStore()
    agent = NodeAgent(
        "n1",
        FakeProbe(REPORTS),
        api,
        interval_s=30,
        pod_resources=PodResourcesClient(kubelet.socket),
        holders_interval_s=0.05,
        clock=lambda: clock[0],
    )
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    deadline = time.monotonic() + 10
    while not api.patches and time.monotonic() < deadline:
        time.sleep(0.01)
    kubelet.hold("ns", "p", "c", [REPORTS[0].uuid])  # clock frozen: only a change can cause a patch
    while len(api.patches) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    agent.stop()
    loop.join(5)
    assert len(api.patches) == 2
    assert '"pod":"p"' in api.patches[1]["metadata"]["annotations"][HOLDERS_ANNOTATION]


def test_print_includes_the_holders_annotation(kubelet, capsys):
    kubelet.hold("ns", "p", "c", ["GPU-fake-t4-0000"])
    argv = ["--node", "n1", "--fake", "1xT4:15360", "--print", "--pod-resources-socket", str(kubelet.socket)]
    assert main(argv) == 0
    holders = json.loads(json.loads(capsys.readouterr().out)["metadata"]["annotations"][HOLDERS_ANNOTATION])
    assert holders["holders"] == {"0": [{"namespace": "ns", "pod": "p", "container": "c"}]}
    assert main([*argv[:-2], "--resources", " , "]) == 2
