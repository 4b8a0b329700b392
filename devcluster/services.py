"""What a Service needs on the harness, for the tests that deploy the product as pods: kube-scheduler (the
Deployment's pods need a node), kube-proxy in iptables mode (a Service's virtual IP, from the host where
kube-apiserver calls the webhook through its Service, and from pods), CoreDNS on the node's address (Service
names inside pods), and a way from pods to kube-apiserver, which listens on 127.0.0.1 only.

kube-proxy and kube-scheduler are built from the k8s.io/kubernetes module like kube-apiserver
(`COMPONENTS="kube-proxy kube-scheduler" bash devcluster/build_kube_components.sh`), CoreDNS from its own
module (devcluster/build_coredns.sh); iptables comes from Debian (devcluster/runtime.sh). Every server binds
127.0.0.1 or the real node's address (TEST-NET-2 on `lo`, never routed). `stop` ends what it started, runs
`kube-proxy --cleanup` (its chains gone), deletes its own rule and puts the sysctl it set back.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.binaries import CACHE, ControlPlaneError, binary_path, free_port
from devcluster.cluster import KUBERNETES_SERVICE_IP, ControlPlane
from devcluster.containerd import tail
from devcluster.processes import stop_process

COREDNS_VERSION = "1.12.1"
POD_NETWORK = "10.244.0.0/16"  # the real nodes' pod CIDRs (devcluster/kubelet.py)
CLUSTER_DOMAIN = "cluster.local"
ROUTE_LOCALNET = Path("/proc/sys/net/ipv4/conf/all/route_localnet")
KUBE_PROXY_LEFTOVERS = ("KUBE-PROXY-CANARY", "KUBE-MARK-MASQ", "KUBE-FIREWALL")
RULE_COMMENT = "gpuledger-devcluster: pods to kube-apiserver"


def coredns_path() -> Path:
    return CACHE / f"coredns-v{COREDNS_VERSION}"


def missing_parts() -> list[str]:
    build = "COMPONENTS='kube-proxy kube-scheduler' bash devcluster/build_kube_components.sh"
    lacking = [
        f"{binary_path(c)} ({build})" for c in ("kube-proxy", "kube-scheduler") if not binary_path(c).exists()
    ]
    if not coredns_path().exists():
        lacking.append(f"{coredns_path()} (bash devcluster/build_coredns.sh)")
    if not shutil.which("iptables"):
        lacking.append("iptables (bash devcluster/runtime.sh)")
    return lacking


def apiserver_rule(cp: ControlPlane) -> list[str]:
    """Pods' packets to the `kubernetes` Service go to kube-apiserver on 127.0.0.1 (an Endpoints object may
    not name a loopback address, so this one address is not kube-proxy's)."""
    return [
        "PREROUTING",
        "-s", POD_NETWORK,
        "-d", KUBERNETES_SERVICE_IP,
        "-p", "tcp",
        "--dport", "443",
        "-m", "comment", "--comment", RULE_COMMENT,
        "-j", "DNAT",
        "--to-destination", f"127.0.0.1:{cp.port}",
    ]  # fmt: skip


@dataclass
class ClusterServices:
    """kube-scheduler, kube-proxy and CoreDNS for `cp`, whose real node has address `node_ip` and name
    `node_name` (its kubelet started with `pod_gateway=True, cluster_dns=node_ip`)."""

    cp: ControlPlane
    node_name: str
    node_ip: str
    workdir: Path | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _route_localnet: str = ""
    _rule: list[str] = field(default_factory=list)

    def start(self, timeout: float = 60.0) -> ClusterServices:
        lacking = missing_parts()
        if lacking:
            raise ControlPlaneError("the cluster services need: " + "; ".join(lacking))
        self.workdir = Path(tempfile.mkdtemp(prefix="gpuledger-services-"))
        try:
            self._route_to_apiserver()
            self._start_scheduler()
            self._start_kube_proxy(timeout)
            self._start_coredns(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> ClusterServices:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log(self, name: str) -> Path:
        assert self.workdir is not None, "the cluster services are not started"
        return self.workdir / f"{name}.log"

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.log(name), "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def _wait_http(self, name: str, url: str, timeout: float) -> None:
        def answered() -> bool:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited {proc.returncode}:\n{tail(self.log(name))}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        try:
            self.cp.wait_for(answered, timeout=timeout, interval=0.3, what=f"{name} serving {url}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{tail(self.log(name))}") from None

    # ------------------------------------------------------------------ the parts
    def _route_to_apiserver(self) -> None:
        """The DNAT rule, and route_localnet so the kernel delivers a pod's packet rewritten to 127.0.0.1."""
        self._route_localnet = ROUTE_LOCALNET.read_text().strip()
        ROUTE_LOCALNET.write_text("1")
        self._rule = apiserver_rule(self.cp)
        subprocess.run(["iptables", "-t", "nat", "-I", *self._rule], check=True, capture_output=True)

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                str(binary_path("kube-scheduler")),
                f"--kubeconfig={self.cp.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self, timeout: float) -> None:
        healthz = free_port()
        self._spawn(
            "kube-proxy",
            [
                str(binary_path("kube-proxy")),
                f"--kubeconfig={self.cp.kubeconfig}",
                f"--hostname-override={self.node_name}",
                "--proxy-mode=iptables",
                f"--cluster-cidr={POD_NETWORK}",
                # pod to Service to a pod on the same bridge: the answer must come back through the host
                "--masquerade-all",
                f"--healthz-bind-address=127.0.0.1:{healthz}",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                # leave the host's conntrack table and timeouts as they are
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                "--iptables-localhost-nodeports=false",
                "--v=1",
            ],
        )
        self._wait_http("kube-proxy", f"http://127.0.0.1:{healthz}/healthz", timeout)

    def _start_coredns(self, timeout: float) -> None:
        assert self.workdir is not None
        ready = free_port()
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {self.node_ip}
    errors
    ready 127.0.0.1:{ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.cp.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""
        )
        self._spawn("coredns", [str(coredns_path()), "-conf", str(corefile)])
        self._wait_http("coredns", f"http://127.0.0.1:{ready}/ready", timeout)

    # ------------------------------------------------------------------ teardown
    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            stop_process(self.procs.pop(name), grace_s=5)
        if binary_path("kube-proxy").exists():
            subprocess.run(
                [str(binary_path("kube-proxy")), "--cleanup", "--proxy-mode=iptables"],
                capture_output=True,
                timeout=60,
            )
        for hook in ("INPUT", "OUTPUT"):  # the jumps to KUBE-FIREWALL kube-proxy adds and --cleanup leaves
            subprocess.run(["iptables", "-D", hook, "-j", "KUBE-FIREWALL"], capture_output=True)
        for table in ("nat", "filter", "mangle"):  # and its own chains
            for chain in KUBE_PROXY_LEFTOVERS:
                subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
                subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)
        if self._rule:
            subprocess.run(["iptables", "-t", "nat", "-D", *self._rule], capture_output=True)
            self._rule = []
        if self._route_localnet:
            ROUTE_LOCALNET.write_text(self._route_localnet)
            self._route_localnet = ""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
