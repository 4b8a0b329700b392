"""A real node for a running ControlPlane: kubelet v1.32 (built like kube-apiserver) on its own containerd,
with a client certificate in system:nodes, registering a Node that runs real pods from the locally built
images.

Everything lives in one temporary folder, serves on loopback only, and is undone by `stop`. It must never
touch a pod, process, cgroup or mount it did not create; the three host sysctls the kubelet sets are put back.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster.binaries import CACHE, binary_path, free_port
from devcluster.cluster import ControlPlane
from devcluster.containerd import CNI_BIN_DIR, RUNTIME_BINARIES, Containerd, mounts_under, tail
from devcluster.device_plugin import DEVICE_PLUGIN_DIR
from devcluster.users import KUBELET_CLIENT_USER

# the node's InternalIP lives on `lo`: the kubelet refuses a 127/8 node IP, and the apiserver dials
# InternalIP. TEST-NET-2 (RFC 5737) is never routed, so nothing off this machine asks for it.
NODE_IP_NET = ipaddress.ip_network("198.51.100.0/24")
CGROUP_FS = Path("/sys/fs/cgroup")
# the kubelet sets these at start (KernelTunableModify); RealNode puts the host's values back once it is up
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# one kubelet per machine may own the device-plugin folder, whose path the kubelet hard-codes
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # hard-coded in the kubelet too
HOST_LOCK = Path(tempfile.gettempdir()) / "gpuledger-realnode.lock"


Part = TypeVar("Part")


def _started(part: Part | None, what: str) -> Part:
    """A part `RealNode.start` creates, or a clear error where it is used before that."""
    if part is None:
        raise RuntimeError(f"the real node is not started: it has no {what} yet")
    return part


class RealNodeUnavailable(RuntimeError):
    """What this machine lacks to run a real node, and the command that provides it."""


def missing_parts() -> list[str]:
    lacking = [f"{b} (bash devcluster/runtime.sh)" for b in RUNTIME_BINARIES if not shutil.which(b)]
    lacking += [
        f"{CNI_BIN_DIR}/{p} (bash devcluster/runtime.sh)"
        for p in ("bridge", "host-local", "loopback")
        if not (CNI_BIN_DIR / p).exists()
    ]
    if not binary_path("kubelet").exists():
        lacking.append(f"{binary_path('kubelet')} (make apiserver)")
    if os.geteuid() != 0:
        lacking.append("root (the kubelet manages cgroups and mounts)")
    return lacking


def node_credentials(cp: ControlPlane, node: str) -> tuple[bytes, bytes]:
    """A client certificate for user system:node:<node> in group system:nodes, signed by the cluster CA."""
    if cp.ca is None:
        raise RuntimeError("the control plane is not started: it has no CA yet")
    ca_cert, ca_key = cp.ca.cert, cp.ca.key
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(ca_cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def node_rbac() -> list[dict]:
    """What kubeadm binds: nodes get system:node (RBAC stands in for the Node authorizer), and the apiserver's
    kubelet client may read logs and exec (the kubelet authorizes it through SubjectAccessReview)."""

    def binding(name: str, role: str, kind: str, subject: str) -> dict:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
        }

    return [
        binding("gpuledger-e2e-nodes", "system:node", "Group", "system:nodes"),
        binding("gpuledger-e2e-kubelet-api", "system:kubelet-api-admin", "User", KUBELET_CLIENT_USER),
    ]


@dataclass
class RealNode:
    """kubelet + containerd registering Node `name` with `cp`; `index` picks its node IP, pod CIDR and
    bridge."""

    cp: ControlPlane
    name: str = "real-node-0"
    index: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)
    workdir: Path | None = None
    lock_timeout: float = 600.0
    # the heartbeat: the kubelet renews its Lease every quarter of this; the node lifecycle controller
    # (cluster.node_lifecycle_args) marks the node NotReady once a renewal is its grace period late
    node_lease_s: int = 8
    node_ip: str = ""
    healthz_url: str = ""
    kubelet: subprocess.Popen | None = None
    containerd: Containerd | None = None
    _lock: int | None = None
    _sysctls: dict[str, str] = field(default_factory=dict)

    @property
    def kubelet_log(self) -> Path:
        return _started(self.workdir, "workdir") / "kubelet.log"

    @property
    def containerd_log(self) -> Path:
        return _started(self.containerd, "containerd").log

    @property
    def pod_resources_socket(self) -> Path:
        return _started(self.workdir, "workdir") / "kubelet" / "pod-resources" / "kubelet.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/gpuledger-{self.name}"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> RealNode:
        lacking = missing_parts()
        if lacking:
            raise RealNodeUnavailable("a real node needs: " + "; ".join(lacking))
        self._take_host_lock()
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix=f"gpuledger-{self.name}-"))
        atexit.register(self.stop)
        try:
            tag = hashlib.sha256(str(self.workdir).encode()).hexdigest()[:8]
            self.node_ip = str(NODE_IP_NET[10 + self.index])
            self.containerd = Containerd(
                self.workdir / "containerd", bridge=f"glbr{tag}", pod_cidr=f"10.244.{self.index}.0/24"
            )
            self.containerd.start(CACHE / "images")
            self._make_cgroup_root()
            subprocess.run(
                ["ip", "addr", "replace", f"{self.node_ip}/32", "dev", "lo"], check=True, capture_output=True
            )
            self.cp.apply(node_rbac())
            self._sysctls = {k: (Path("/proc/sys") / k).read_text() for k in KUBELET_SYSCTLS}
            self._start_kubelet()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        finally:
            self._restore_sysctls()
        return self

    def stop(self, delete_node: bool = True) -> None:
        """Kubelet, pods (killed through their cgroups), containerd and its shims, mounts, addresses: all
        gone."""
        if self.workdir is None:
            return
        self.kill_kubelet()
        self._kill_cgroup_tree()
        if self.containerd is not None:
            self.containerd.teardown()
        self._remove_cgroup_tree()
        for mount in reversed(
            mounts_under(self.workdir)
        ):  # the kubelet bind-mounts its root folder (rshared)
            subprocess.run(["umount", "-l", mount], capture_output=True)
        if self.node_ip:
            subprocess.run(["ip", "addr", "del", f"{self.node_ip}/32", "dev", "lo"], capture_output=True)
        for leftover in ("kubelet.sock", "kubelet_internal_checkpoint"):
            (DEVICE_PLUGIN_DIR / leftover).unlink(missing_ok=True)
        for link in CONTAINER_LOG_LINKS.glob("*.log"):  # the kubelet's links into our pod-logs folder
            if link.is_symlink() and os.readlink(link).startswith(str(self.workdir) + "/"):
                link.unlink(missing_ok=True)
        if delete_node and self.cp.kubeconfig:
            self.cp.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false", check=False)
        if not os.environ.get("GPULEDGER_KEEP_NODE"):
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def kill_kubelet(self) -> None:
        """The kubelet alone dies (SIGKILL): pods keep running, the Node goes NotReady once its lease
        lapses."""
        if self.kubelet is not None and self.kubelet.poll() is None:
            self.kubelet.kill()
            self.kubelet.wait(10)

    def restart_kubelet(self, timeout: float = 60.0) -> None:
        self.kill_kubelet()
        self._start_kubelet()
        self.wait_ready(timeout)
        self._restore_sysctls()

    def wait_ready(self, timeout: float = 120.0) -> dict:
        def ready():
            kubelet = _started(self.kubelet, "kubelet")
            if kubelet.poll() is not None:
                raise RuntimeError(
                    f"kubelet exited {kubelet.returncode} ({self.kubelet_log}):\n{tail(self.kubelet_log)}"
                )
            if not self.healthy():  # a restarted kubelet: the Node still reads Ready from its predecessor
                return None
            proc = self.cp.kubectl("get", "node", self.name, "-o", "json", check=False)
            if proc.returncode != 0:
                return None
            node = yaml.safe_load(proc.stdout)
            conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            return node if conditions.get("Ready") == "True" else None

        try:
            return self.cp.wait_for(ready, timeout=timeout, interval=0.5, what=f"node {self.name} Ready")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\nkubelet log ({self.kubelet_log}):\n{tail(self.kubelet_log)}") from None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.healthz_url, timeout=2) as r:
                return r.read() == b"ok"
        except OSError:
            return False

    # ------------------------------------------------------------------ what it holds, what it offers
    def pod_devices(self, resource: str = "nvidia.com/gpu") -> dict[tuple[str, str, str], list[str]]:
        """(namespace, pod, container) -> the `resource` device ids the kubelet assigned, from PodResources
        `List` (the kubelet's own record of running pods; terminated pods are not listed)."""
        import grpc  # type: ignore[import-untyped]  # no stubs here, as in device_plugin.py

        from devcluster import kubelet_api

        api = kubelet_api.load()
        with grpc.insecure_channel(f"unix://{self.pod_resources_socket}") as channel:
            stub = api.podresources_grpc.PodResourcesListerStub(channel)
            listed = stub.List(api.podresources.ListPodResourcesRequest(), timeout=10)
        return {
            (p.namespace, p.name, c.name): [
                d for dev in c.devices if dev.resource_name == resource for d in dev.device_ids
            ]
            for p in listed.pod_resources
            for c in p.containers
        }

    def advertise_gpus(
        self, devices: list[dict], resource: str = "nvidia.com/gpu", timeout: float = 30
    ) -> dict:
        """Publish GPUs the way a node without a device plugin does (visibility modes `runtime-uuids`,
        `host-indices`): the real node agent (`python -m allocator.node_agent --once --advertise-capacity`,
        its fake probe reporting `devices`, as `devcluster.nodes.device_entries` makes them) writes the
        `agentaflow.gpu/devices` annotation and PATCHes `resource` capacity onto the Node's status. Returns
        the Node once the kubelet, which derives allocatable from capacity, reports the count allocatable."""
        count = str(sum(bool(d.get("healthy", True)) for d in devices))
        fake = [
            {
                "index": d["index"],
                "uuid": d["uuid"],
                "product": d["product"],
                "memory_mib": d["memoryMiB"],
                "healthy": d.get("healthy", True),
                "reason": d.get("reason", ""),
            }
            for d in devices
        ]
        argv = [
            sys.executable, "-m", "allocator.node_agent", "--node", self.name, "--once",
            "--kubeconfig", str(self.cp.kubeconfig), "--fake", json.dumps(fake),
            "--pod-resources-socket", str(self.pod_resources_socket), "--advertise-capacity", resource,
        ]  # fmt: skip
        root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        if proc.returncode != 0:
            output = proc.stdout[-2000:] + proc.stderr[-2000:]
            raise RuntimeError(f"the node agent exited {proc.returncode}: {output}")

        def allocatable():
            node = self.cp.get_json("node", self.name)
            return node if node["status"].get("allocatable", {}).get(resource) == count else None

        return self.cp.wait_for(
            allocatable, timeout=timeout, what=f"the kubelet reporting {count} {resource} allocatable"
        )

    # ------------------------------------------------------------------ the kubelet
    def kubelet_config(self) -> dict:
        port, healthz = free_port(self.node_ip), free_port()
        self.healthz_url = f"http://127.0.0.1:{healthz}/healthz"
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": self.cp.ca_file},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{_started(self.containerd, 'containerd').socket}",
            "podLogsDir": str(_started(self.workdir, "workdir") / "pod-logs"),
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "registerWithTaints": self.taints,
            "makeIPTablesUtilChains": False,  # no iptables here, and nothing of ours needs it
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,  # the images cannot be pulled
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },  # a shared disk filling up must not evict test pods
            "volumeStatsAggPeriod": "0s",
            # node status (capacity a device plugin just registered, among others) reaches the API within 2s
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "5m",  # unchanged status: rarely
            "nodeLeaseDurationSeconds": self.node_lease_s,
            "resolvConf": "/etc/resolv.conf",
        }

    def _start_kubelet(self) -> None:
        folder = _started(self.workdir, "workdir") / "kubelet"
        (folder / "pki").mkdir(parents=True, exist_ok=True)
        cert, key = node_credentials(self.cp, self.name)
        (folder / "pki" / "node.crt").write_bytes(cert)
        (folder / "pki" / "node.key").write_bytes(key)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": self.cp.url, "certificate-authority": self.cp.ca_file}}
            ],
            "users": [
                {
                    "name": self.name,
                    "user": {
                        "client-certificate": str(folder / "pki" / "node.crt"),
                        "client-key": str(folder / "pki" / "node.key"),
                    },
                }
            ],
            "contexts": [{"name": self.name, "context": {"cluster": "e2e", "user": self.name}}],
            "current-context": self.name,
        }
        (folder / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        (folder / "config.yaml").write_text(yaml.safe_dump(self.kubelet_config()))
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        argv = [
            str(binary_path("kubelet")),
            f"--config={folder / 'config.yaml'}",
            f"--kubeconfig={folder / 'kubeconfig'}",
            f"--root-dir={folder}",
            f"--cert-dir={folder / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            *([f"--node-labels={labels}"] if labels else []),
            "--v=1",
        ]
        with open(self.kubelet_log, "ab") as log:
            self.kubelet = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    # ------------------------------------------------------------------ host state
    def _take_host_lock(self) -> None:
        fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock = fd
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RealNodeUnavailable(
                        f"another real node holds {HOST_LOCK} (one kubelet per machine "
                        f"owns {DEVICE_PLUGIN_DIR}); waited {self.lock_timeout:.0f}s"
                    ) from None
                time.sleep(1)

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            path = Path("/proc/sys") / key
            if path.read_text() != value:
                path.write_text(value)

    def _hierarchies(self) -> list[Path]:
        """Every mounted cgroup v1 hierarchy (cpu, memory, ..., name=systemd): the kubelet uses them all."""
        return [p for p in sorted(CGROUP_FS.iterdir()) if p.is_dir() and os.path.ismount(p)]

    def _make_cgroup_root(self) -> None:
        """The kubelet requires --cgroup-root to exist; a cpuset child starts with no CPUs, so copy the
        parent's."""
        for hierarchy in self._hierarchies():
            root = hierarchy / self.cgroup_root.lstrip("/")
            root.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / name).exists() and not (root / name).read_text().strip():
                    (root / name).write_text((hierarchy / name).read_text())

    def _cgroups_deepest_first(self, hierarchy: Path) -> list[Path]:
        root = hierarchy / self.cgroup_root.lstrip("/")
        if not root.exists():
            return []
        return sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: -len(p.parts))

    def _kill_cgroup_tree(self) -> None:
        """SIGKILL every process in this node's cgroups (its pods' containers, nothing else), until none is
        left."""
        for _ in range(50):
            pids = {
                int(pid)
                for h in self._hierarchies()
                for cg in self._cgroups_deepest_first(h)
                for pid in _read(cg / "cgroup.procs").split()
            }
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _remove_cgroup_tree(self) -> None:
        for hierarchy in self._hierarchies():
            for cgroup in self._cgroups_deepest_first(hierarchy):
                with contextlib.suppress(OSError):
                    cgroup.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
