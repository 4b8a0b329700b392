"""A real node for a running ControlPlane: kubelet (v1.37 by default, built like kube-apiserver) on its own
containerd, with a client certificate in system:nodes, registering a Node that runs real pods from the locally
built images.

Everything lives in one temporary folder, serves on loopback only, and is undone by `stop`. It must never
touch a pod, process, cgroup or mount it did not create; the three host sysctls the kubelet sets are put back.
Its parts: node_identity.py (certificates, kubeconfig), node_host.py (host lock, sysctls, cgroups),
node_gpus.py (PodResources, advertised GPUs).
"""

from __future__ import annotations

import atexit
import hashlib
import ipaddress
import os
import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml

from devcluster import node_gpus
from devcluster.binaries import CACHE, binary_path, free_port
from devcluster.cluster import ControlPlane
from devcluster.containerd import (
    CNI_BIN_DIR,
    RUNTIME_BINARIES,
    Containerd,
    mounts_under,
    runtime_binary,
    tail,
)
from devcluster.device_plugin import DEVICE_PLUGIN_DIR
from devcluster.node_host import (
    RealNodeUnavailable,
    kill_cgroup_tree,
    make_cgroup_root,
    read_sysctls,
    remove_cgroup_tree,
    restore_sysctls,
    take_host_lock,
)
from devcluster.node_identity import node_credentials, node_rbac, write_node_kubeconfig
from gpuledger.names import GPU_RESOURCE

# importers name these from here (tests): the node, what it needs, and the credentials it is given
__all__ = ["RealNode", "RealNodeUnavailable", "missing_parts", "node_credentials", "node_rbac"]

# the node's InternalIP lives on `lo`: the kubelet refuses a 127/8 node IP, and the apiserver dials
# InternalIP. TEST-NET-2 (RFC 5737) is never routed, so nothing off this machine asks for it.
NODE_IP_NET = ipaddress.ip_network("198.51.100.0/24")
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # hard-coded in the kubelet too


Part = TypeVar("Part")


def _started(part: Part | None, what: str) -> Part:
    """A part `RealNode.start` creates, or a clear error where it is used before that."""
    if part is None:
        raise RuntimeError(f"the real node is not started: it has no {what} yet")
    return part


def missing_parts() -> list[str]:
    lacking = [f"{b} (bash devcluster/build_runtime.sh)" for b in RUNTIME_BINARIES if not runtime_binary(b)]
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
    # pods routed through their bridge and resolving names at `cluster_dns` (devcluster/services.py)
    pod_gateway: bool = False
    cluster_dns: str = ""
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
        self._lock = take_host_lock(self.lock_timeout)
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix=f"gpuledger-{self.name}-"))
        atexit.register(self.stop)
        try:
            tag = hashlib.sha256(str(self.workdir).encode()).hexdigest()[:8]
            self.node_ip = str(NODE_IP_NET[10 + self.index])
            self.containerd = Containerd(
                self.workdir / "containerd",
                bridge=f"glbr{tag}",
                pod_cidr=f"10.244.{self.index}.0/24",
                gateway=self.pod_gateway,
            )
            self.containerd.start(CACHE / "images")
            make_cgroup_root(self.cgroup_root)
            subprocess.run(
                ["ip", "addr", "replace", f"{self.node_ip}/32", "dev", "lo"], check=True, capture_output=True
            )
            self.cp.apply(node_rbac())
            self._sysctls = read_sysctls()
            self._start_kubelet()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        finally:
            restore_sysctls(self._sysctls)
        return self

    def stop(self, delete_node: bool = True) -> None:
        """Kubelet, pods (killed through their cgroups), containerd and its shims, mounts, addresses: all
        gone."""
        if self.workdir is None:
            return
        self.kill_kubelet()
        kill_cgroup_tree(self.cgroup_root)
        if self.containerd is not None:
            self.containerd.teardown()
        remove_cgroup_tree(self.cgroup_root)
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
        restore_sysctls(self._sysctls)

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
    def pod_devices(self, resource: str = GPU_RESOURCE) -> dict[tuple[str, str, str], list[str]]:
        """(namespace, pod, container) -> the `resource` device ids the kubelet assigned (node_gpus.py)."""
        return node_gpus.pod_devices(self.pod_resources_socket, resource)

    def allocatable_devices(self, resource: str = GPU_RESOURCE) -> list[str]:
        """The `resource` device ids the kubelet can assign, from PodResources (node_gpus.py)."""
        return node_gpus.allocatable_devices(self.pod_resources_socket, resource)

    def advertise_gpus(self, devices: list[dict], resource: str = GPU_RESOURCE, timeout: float = 30) -> dict:
        """Publish `devices` through the real node agent, as a node without a device plugin does; the Node
        once its `resource` is allocatable (node_gpus.py)."""
        return node_gpus.advertise_gpus(
            self.cp, self.name, self.pod_resources_socket, devices, resource, timeout
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
            # a mounted ConfigMap's change reaches the pod at its next sync: within ~10 s, not a minute (the
            # deployed test changes the webhook's config this way)
            "syncFrequency": "10s",
            # node status (capacity a device plugin just registered, among others) reaches the API within 2s
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "5m",  # unchanged status: rarely
            "nodeLeaseDurationSeconds": self.node_lease_s,
            "resolvConf": "/etc/resolv.conf",
            **(
                {"clusterDNS": [self.cluster_dns], "clusterDomain": "cluster.local"}
                if self.cluster_dns
                else {}
            ),
        }

    def _start_kubelet(self) -> None:
        folder = _started(self.workdir, "workdir") / "kubelet"
        write_node_kubeconfig(self.cp, self.name, folder)
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
