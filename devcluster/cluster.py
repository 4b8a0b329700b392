"""A real, local Kubernetes control plane for tests and the demo: etcd + kube-apiserver (+ the workload
controllers).

Modelled on controller-runtime's envtest: a bare apiserver with static-token users, RBAC, service-account keys
and the ServiceAccount admission plugin off (no token controller runs, so pods without SA tokens must be
accepted), and the Kubeflow training CRDs (devcluster/kubeflow.py). kube-controller-manager runs only the
controllers that turn Jobs, StatefulSets and Deployments into pods, so workloads arrive at the webhook exactly
as they would in a cluster. No scheduler and no kubelet run: pods stay Pending with whatever placement
admission gave them, which is what the tests read. It must never leave a process it started running after
`stop` (also run at exit). Its parts: binaries.py (what runs), users.py (who may call), kubeclient.py.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devcluster import kubeflow
from devcluster.binaries import (
    REPO,
    ControlPlaneError,
    binary_path,
    etcd_path,
    free_port,
    missing_binaries,
    workload_api_args,
)
from devcluster.kubeclient import ExistingCluster, KubeClient, KubectlError
from devcluster.users import (
    ADMIN,
    ALICE,
    KUBELET_CLIENT_USER,
    USERS,
    WEBHOOK_USER,
    rbac_objects,
    write_sa_keys,
)
from gpuledger.certs import pki

# importers name these from here (tests, the demo): the control plane and what it is built from
__all__ = [
    "ADMIN",
    "ALICE",
    "CONTROLLERS",
    "NODE_LIFECYCLE_CONTROLLER",
    "REPO",
    "WEBHOOK_USER",
    "ControlPlane",
    "ControlPlaneError",
    "ExistingCluster",
    "KubeClient",
    "KubectlError",
    "free_port",
    "missing_binaries",
    "node_lifecycle_args",
]

CRDS_DIR = REPO / "manifests" / "crds"
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service

# only what makes workloads real; no node lifecycle (it would taint our kubelet-less nodes), no pod GC
CONTROLLERS = (
    "job-controller",
    "statefulset-controller",
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
)
# a dedicated control plane for real nodes may add the node lifecycle controller: with a dead kubelet its Node
# goes Ready=Unknown and gets the unreachable taints. Not in the shared one (its fake nodes send no heartbeat)
# and without the taint-eviction controller, so pods of a NotReady node are never evicted under a test.
NODE_LIFECYCLE_CONTROLLER = "node-lifecycle-controller"


def node_lifecycle_args(grace_s: int = 12) -> tuple[str, ...]:
    """kube-controller-manager flags for a node lifecycle fast enough for tests: a node whose lease was not
    renewed for `grace_s` is marked NotReady within a second more (the real node renews every few seconds,
    `RealNode.node_lease_s`)."""
    return (
        f"--node-monitor-grace-period={grace_s}s",
        "--node-monitor-period=1s",
        f"--node-startup-grace-period={max(grace_s, 30)}s",
    )


@dataclass
class ControlPlane(KubeClient):
    """etcd + kube-apiserver (+ kube-controller-manager) bound to 127.0.0.1 in a temporary directory."""

    with_controllers: bool = True
    workdir: Path | None = None
    extra_apiserver_args: tuple[str, ...] = ()
    controllers: tuple[str, ...] = CONTROLLERS  # add NODE_LIFECYCLE_CONTROLLER only where every node is real
    extra_controller_args: tuple[str, ...] = ()
    # ServiceAccount: no token controller runs, pods without a token must be accepted. TaintNodesByCondition:
    # it taints every new node not-ready, a taint only the node lifecycle controller would lift. A control
    # plane whose pods run the product (devcluster/services.py) keeps ServiceAccount: their tokens come from
    # the TokenRequest API through the kubelet
    disabled_admission_plugins: tuple[str, ...] = ("ServiceAccount", "TaintNodesByCondition")
    url: str = ""
    port: int = 0
    tokens: dict[str, str] = field(default_factory=dict)
    ca: pki.KeyPair | None = None
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _own_workdir: bool = False

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> ControlPlane:
        missing = missing_binaries(self.with_controllers)
        if missing:
            raise ControlPlaneError(
                f"missing {', '.join(missing)}: run `make apiserver` (devcluster/build_kube_components.sh)"
            )
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="gpuledger-cp-"))
            self._own_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._start_etcd()
            self._start_apiserver(timeout)
            self._bootstrap()
            if self.with_controllers:
                self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(3)  # the API server drains open watches for long; test data needs no grace
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        if (
            self._own_workdir
            and self.workdir
            and self.workdir.exists()
            and not os.environ.get("GPULEDGER_KEEP_CP")
        ):
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def _started_workdir(self) -> Path:
        """`workdir` once `start` has chosen it."""
        if self.workdir is None:
            raise ControlPlaneError("the control plane is not started: it has no workdir yet")
        return self.workdir

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self._started_workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self._procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self._started_workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _wait(self, name: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self._procs[name]
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited {proc.returncode}:\n{self.log_tail(name)}")
            if check():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not ready after {timeout:.0f}s:\n{self.log_tail(name)}")

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                str(etcd_path()),
                "--data-dir",
                str(self._started_workdir / "etcd"),
                "--listen-client-urls",
                self.etcd_url,
                "--advertise-client-urls",
                self.etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # test data: durability across power loss is not the point
                "--log-level",
                "warn",
            ],
        )

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=1) as r:
                    return json.load(r).get("health") == "true"
            except (OSError, ValueError):
                return False

        self._wait("etcd", healthy, 30)

    def _start_apiserver(self, timeout: float) -> None:
        certs = self._started_workdir / "pki"
        certs.mkdir(exist_ok=True)
        self.ca = pki.make_ca("gpuledger-e2e-cluster-ca")
        serving = pki.make_serving_cert(
            self.ca,
            ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ["127.0.0.1", KUBERNETES_SERVICE_IP],  # pods reach it through the `kubernetes` Service
        )
        paths = pki.write_bundle(certs, self.ca, serving)
        self.ca_file = str(paths["ca.crt"])
        sa_key, sa_pub = write_sa_keys(certs)
        # logs/exec on a real node (devcluster/kubelet.py): the kubelet trusts this CA and serves on its
        # InternalIP
        kubelet_client = pki.make_client_cert(self.ca, KUBELET_CLIENT_USER)
        (certs / "kubelet-client.crt").write_bytes(kubelet_client.cert_pem)
        (certs / "kubelet-client.key").write_bytes(kubelet_client.key_pem)
        lines = []
        for user, groups in USERS.items():
            token = os.urandom(16).hex()
            self.tokens[user] = token
            lines.append(
                f'{token},{user},{user},"{",".join(groups)}"' if groups else f"{token},{user},{user}"
            )
        (certs / "tokens.csv").write_text("\n".join(lines) + "\n")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._apiserver_argv = [
            str(binary_path("kube-apiserver")),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={certs}",
            f"--tls-cert-file={paths['tls.crt']}",
            f"--tls-private-key-file={paths['tls.key']}",
            f"--client-ca-file={paths['ca.crt']}",
            f"--token-auth-file={certs / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--disable-admission-plugins={','.join(self.disabled_admission_plugins)}",
            f"--kubelet-client-certificate={certs / 'kubelet-client.crt'}",
            f"--kubelet-client-key={certs / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            *workload_api_args("kube-apiserver"),
            *self.extra_apiserver_args,
        ]
        self._spawn("kube-apiserver", self._apiserver_argv)
        self._wait("kube-apiserver", lambda: self.get_path("/readyz")[0] == 200, timeout)

    def restart_apiserver(self, timeout: float = 60.0) -> None:
        """Stop and start kube-apiserver on the same port and etcd: its watch cache starts over, so watchers
        resuming from an older resourceVersion get 410 Gone, as after a control plane upgrade."""
        proc = self._procs["kube-apiserver"]
        proc.kill()  # a crash; a graceful stop would wait for every open watch to drain
        proc.wait(15)
        self._spawn("kube-apiserver", self._apiserver_argv)
        self._wait("kube-apiserver", lambda: self.get_path("/readyz")[0] == 200, timeout)

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                str(binary_path("kube-controller-manager")),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--controllers={','.join(self.controllers)}",
                *workload_api_args("kube-controller-manager"),
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-job-syncs=10",
                "--v=1",
                *self.extra_controller_args,
            ],
        )
        # the controller-manager has no health port here; give it a moment and make sure it did not exit
        self._wait("kube-controller-manager", lambda: True, 5)

    def _bootstrap(self) -> None:
        self.kubeconfig = self.write_kubeconfig(ADMIN)
        self.kubeconfigs = {user: self.write_kubeconfig(user) for user in USERS}
        self.apply(rbac_objects())
        kubeflow.install(self)  # workloads of the earlier tools' users: PyTorchJob, MPIJob, TFJob
        # GPUWorkload (both groups) and GPUNode, for the controller
        self.apply([yaml.safe_load(p.read_text()) for p in sorted(CRDS_DIR.glob("gpu*.yaml"))])
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "-l",
            "app.kubernetes.io/component=controller",
        )

    # ------------------------------------------------------------------ clients
    @property
    def admin_token(self) -> str:
        return self.tokens[ADMIN]

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    def get_path(self, path: str, user: str = ADMIN) -> tuple[int, str]:
        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.tokens[user]}"}
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError as e:
            return 0, str(e)

    def write_kubeconfig(self, user: str, path: Path | None = None) -> str:
        safe = user.replace(":", "-")
        path = path or self._started_workdir / f"kubeconfig-{safe}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuledger-e2e",
                    "cluster": {"server": self.url, "certificate-authority": self.ca_file},
                }
            ],
            "users": [{"name": safe, "user": {"token": self.tokens[user]}}],
            "contexts": [{"name": safe, "context": {"cluster": "gpuledger-e2e", "user": safe}}],
            "current-context": safe,
        }
        Path(path).write_text(yaml.safe_dump(config))
        os.chmod(path, 0o600)
        return str(path)

    def kubeconfig_for(self, user: str | None) -> str:
        return self.kubeconfig if user in (None, ADMIN) else self.kubeconfigs[user]
