"""The real node's parts that need no kubelet: image tarballs, containerd's config, node credentials, and
the fake device plugin answering the device-plugin protocol to a stand-in for the kubelet's registry (in a
child process: gRPC never runs in the test process)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.x509.oid import NameOID

from devcluster import images, kubelet_api
from devcluster.binaries import REPO
from devcluster.containerd import Containerd
from devcluster.kubelet import node_credentials, node_rbac
from gpuledger.certs import pki

BUSYBOX = images.BUSYBOX


def _members(tar_bytes: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_docker_archive_names_the_image_and_its_layer_digest():
    layer = b"not really a tar, only bytes to digest"
    archive = images.docker_archive("registry.k8s.io/pause:3.10", layer, {"Entrypoint": ["/pause"]})
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        (entry,) = manifest
        config = json.load(tar.extractfile(entry["Config"]))
        assert tar.extractfile(entry["Layers"][0]).read() == layer
    assert entry["RepoTags"] == ["registry.k8s.io/pause:3.10"]
    assert config["rootfs"]["diff_ids"] == [f"sha256:{entry['Layers'][0].split('/')[0]}"]
    assert (config["os"], config["architecture"], config["config"]["Entrypoint"]) == (
        "linux",
        "amd64",
        ["/pause"],
    )


@pytest.mark.skipif(not BUSYBOX.exists(), reason=f"{BUSYBOX} missing: bash devcluster/runtime.sh")
def test_rootfs_layer_is_busybox_and_its_applets_and_is_reproducible():
    layer = images.rootfs_layer()
    members = _members(layer)
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode == 0o755
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "/bin/busybox"
    assert members["tmp"].mode == 0o1777
    assert images.rootfs_layer() == layer  # fixed mtimes and order: the same busybox, the same digests


@pytest.mark.parametrize("version", [2, 3])
def test_containerd_config_keeps_to_its_folder_and_names_the_pause_image(tmp_path, version):
    """Version 2 for Debian's containerd 1.6, version 3 for the cached containerd 2 (build_runtime.sh)."""
    ctd = Containerd(tmp_path, bridge="glbrtest", pod_cidr="10.244.3.0/24")
    config = tomllib.loads(ctd.config_toml(version))
    plugins = config["plugins"]
    assert config["version"] == version
    assert config["grpc"]["address"] == str(tmp_path / "containerd.sock")
    assert all(str(config[k]).startswith(str(tmp_path)) for k in ("root", "state"))
    server = plugins["io.containerd.grpc.v1.cri"]
    assert server["stream_server_address"] == "127.0.0.1"
    if version == 2:
        runtime = server
        assert server["sandbox_image"] == images.PAUSE_IMAGE
    else:
        runtime = plugins["io.containerd.cri.v1.runtime"]
        assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == images.PAUSE_IMAGE
        assert plugins["io.containerd.nri.v1.nri"]["disable"] is True
        assert runtime["cni"]["bin_dirs"] and runtime["cni"]["conf_dir"] == str(tmp_path / "net.d")
    assert runtime["restrict_oom_score_adj"] is True
    assert set(runtime["containerd"]["runtimes"]) == {"runc", "nvidia"}
    (bridge,) = ctd.cni_conflist()["plugins"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]] and not bridge["ipMasq"]


def test_node_credentials_are_a_system_nodes_client_cert_from_the_cluster_ca():
    ca = pki.make_ca("test-cluster-ca")
    cert_pem, _ = node_credentials(SimpleNamespace(ca=ca), "real-node-7")
    cert = pki.KeyPair(cert_pem, b"").cert
    subject = {a.oid: a.value for a in cert.subject}
    assert subject[NameOID.COMMON_NAME] == "system:node:real-node-7"
    assert subject[NameOID.ORGANIZATION_NAME] == "system:nodes"
    assert cert.issuer == ca.cert.subject
    roles = {b["roleRef"]["name"]: b["subjects"][0]["name"] for b in node_rbac()}
    assert roles["system:node"] == "system:nodes"


def test_strip_gogo_drops_only_the_go_options():
    proto = (
        'syntax = "proto3";\nimport "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
        "option (gogoproto.sizer_all) = true;\n"
        'message A {\n\trepeated string devices_ids = 1 [(gogoproto.customname) = "DevicesIDs"];\n}\n'
    )
    assert (
        kubelet_api.strip_gogo(proto)
        == 'syntax = "proto3";\nmessage A {\n\trepeated string devices_ids = 1;\n}\n'
    )


@pytest.mark.skipif(not shutil.which("go"), reason="needs go to fetch the k8s.io/kubelet module")
def test_vendored_protos_are_the_kubelet_modules_minus_gogo_options():
    """gpuledger/node_agent/protos/ is the module's .proto files, gogoproto options dropped, and a header."""
    module = kubelet_api.kubelet_module_dir()
    for folder, path in kubelet_api.PROTOS.items():
        ours = (kubelet_api.PROTOS_DIR / folder / "api.proto").read_text()
        assert ours == kubelet_api.vendored((module / path).read_text(), path), folder
        assert "Apache License, Version 2.0" in ours and "gogoproto" not in ours.split("strip_gogo", 1)[1]


def _stubs_available() -> bool:
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        return False
    return True  # the .proto files are vendored: no Go needed


def exercise_fake_plugin() -> dict:
    """Run in a child process (gRPC never lives in the test process, which forks): a stand-in for the
    kubelet's registry, the fake plugin registering with it, and the calls the kubelet makes; what each
    returned, for the test to compare."""
    import grpc

    from devcluster.device_plugin import DevicePluginError, FakeGPUPlugin

    api = kubelet_api.load()
    registered = []

    class Registry:  # what the kubelet's device manager serves at device-plugins/kubelet.sock
        def Register(self, request, context):
            registered.append(request)
            return api.deviceplugin.Empty()

    folder = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # unix socket paths are short
    kubelet = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api.deviceplugin_grpc.add_RegistrationServicer_to_server(Registry(), kubelet)
    kubelet.add_insecure_port(f"unix://{folder / 'kubelet.sock'}")
    kubelet.start()
    ids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(3)]
    seen: dict = {"ids": ids}
    try:
        with (
            FakeGPUPlugin(ids, socket_dir=folder) as plugin,
            grpc.insecure_channel(f"unix://{plugin.socket}") as channel,
        ):
            seen["endpoint"] = plugin.endpoint
            seen["registered"] = [
                [r.version, r.resource_name, r.endpoint, r.options.get_preferred_allocation_available]
                for r in registered
            ]
            seen["registrations"] = plugin.registrations
            stub = api.deviceplugin_grpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(api.deviceplugin.Empty(), timeout=10)
            seen["listed"] = [[d.ID, d.health] for d in next(stream).devices]
            plugin.set_health(ids[1], False)
            seen["after_unhealthy"] = [d.health for d in next(stream).devices]
            seen["health"] = plugin.health
            stream.cancel()
            preferred = stub.GetPreferredAllocation(
                api.deviceplugin.PreferredAllocationRequest(
                    container_requests=[
                        api.deviceplugin.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[ids[2], ids[0]],
                            must_include_deviceIDs=[ids[2]],
                            allocation_size=2,
                        )
                    ]
                )
            )
            seen["preferred_answer"] = list(preferred.container_responses[0].deviceIDs)
            seen["preferred"] = plugin.preferred
            answer = stub.Allocate(
                api.deviceplugin.AllocateRequest(
                    container_requests=[
                        api.deviceplugin.ContainerAllocateRequest(devices_ids=[ids[0], ids[2]])
                    ]
                )
            )
            seen["envs"] = dict(answer.container_responses[0].envs)
            seen["allocations"] = plugin.allocations
            try:
                stub.Allocate(
                    api.deviceplugin.AllocateRequest(
                        container_requests=[
                            api.deviceplugin.ContainerAllocateRequest(devices_ids=["GPU-nope"])
                        ]
                    )
                )
                seen["unknown_device"] = "allocated"
            except grpc.RpcError as denied:
                seen["unknown_device"] = denied.code().name
            try:
                plugin.set_health("GPU-nope", False)
                seen["unknown_health"] = "accepted"
            except DevicePluginError as refused:
                seen["unknown_health"] = str(refused)
            seen["plugin_pid"] = plugin.proc.pid if plugin.proc else None
        seen["socket_after_stop"] = plugin.socket.exists()
        seen["allocations_after_stop"] = plugin.allocations
    finally:
        kubelet.stop(0)
        shutil.rmtree(folder, ignore_errors=True)
    return seen


def _in_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=REPO)


@pytest.mark.skipif(not _stubs_available(), reason="needs grpcio-tools")
def test_fake_plugin_registers_and_answers_like_nvidias():
    proc = _in_child(
        "import json; from tests.devcluster.test_real_node_parts import exercise_fake_plugin as f; "
        "print(json.dumps(f()))"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    ids = seen["ids"]
    assert seen["registered"] == [["v1beta1", "nvidia.com/gpu", seen["endpoint"], True]]
    assert seen["registrations"] == 1
    assert seen["listed"] == [[i, "Healthy"] for i in ids]
    assert seen["after_unhealthy"] == ["Healthy", "Unhealthy", "Healthy"]
    assert seen["health"] == {ids[0]: "Healthy", ids[1]: "Unhealthy", ids[2]: "Healthy"}
    assert seen["preferred_answer"] == [ids[2], ids[0]]
    assert seen["preferred"] == [{"available": [ids[2], ids[0]], "must_include": [ids[2]], "size": 2}]
    assert seen["envs"] == {"NVIDIA_VISIBLE_DEVICES": f"{ids[0]},{ids[2]}"}
    assert seen["allocations"] == [[ids[0], ids[2]]]
    assert seen["unknown_device"] == "INVALID_ARGUMENT"
    assert "GPU-nope" in seen["unknown_health"]
    # stopped: unregistered, its process gone, its record still readable
    assert seen["socket_after_stop"] is False
    assert seen["allocations_after_stop"] == [[ids[0], ids[2]]]
    assert not Path(f"/proc/{seen['plugin_pid']}").exists()


def test_fake_plugin_without_a_kubelet_times_out_and_leaves_no_process(tmp_path):
    from devcluster.device_plugin import FakeGPUPlugin

    folder = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # unix socket paths are short
    plugin = FakeGPUPlugin(["GPU-0"], socket_dir=folder, log=tmp_path / "plugin.log")
    try:
        with pytest.raises(TimeoutError, match="no kubelet device-plugin registration socket"):
            plugin.start(timeout=1)
        assert plugin.proc is None and not plugin.socket.exists()
        assert plugin.registrations == 0 and plugin.health == {"GPU-0": "Healthy"}
    finally:
        plugin.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_real_nodes_harness_never_imports_grpc():
    """gRPC's threads in a process that forks (Ray's workers, kubectl) can crash the child: the plugin and
    PodResources run in processes of their own, and importing the harness brings no grpc."""
    modules = "devcluster.kubelet, devcluster.device_plugin, devcluster.node_gpus, devcluster.agent_process"
    proc = _in_child(f"import sys, {modules}; print('grpc' in sys.modules)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "False"


def test_kubelet_heartbeat_is_well_inside_the_lifecycle_grace_period(tmp_path):
    """The lease the kubelet renews every quarter of its duration must be renewed several times within the
    node lifecycle controller's grace period, or a healthy real node would flap NotReady."""
    from devcluster.cluster import node_lifecycle_args
    from devcluster.kubelet import RealNode

    cp = SimpleNamespace(ca_file=str(tmp_path / "ca.crt"))
    node = RealNode(cp, workdir=tmp_path, node_ip="127.0.0.1")  # type: ignore[arg-type]
    node.containerd = SimpleNamespace(socket=tmp_path / "containerd.sock")  # type: ignore[assignment]
    lease = node.kubelet_config()["nodeLeaseDurationSeconds"]
    args = dict(a.removeprefix("--").split("=", 1) for a in node_lifecycle_args(12))
    grace = int(args["node-monitor-grace-period"].removesuffix("s"))
    assert lease / 4 * 3 < grace  # three renewals fit in the grace period
    assert args["node-monitor-period"] == "1s"


def test_control_plane_runs_the_node_lifecycle_controller_only_when_asked():
    from devcluster.cluster import CONTROLLERS, NODE_LIFECYCLE_CONTROLLER, ControlPlane

    assert NODE_LIFECYCLE_CONTROLLER not in CONTROLLERS  # the shared plane's fake nodes send no heartbeat
    assert ControlPlane().controllers == CONTROLLERS
