"""kube-scheduler for the test control plane: binds pods that wait for no one else.

The control plane (devcluster/cluster.py) runs no scheduler, because gpuledger binds most pods itself
(`spec.nodeName`, or node affinity the tests read back). A pod that waited in the ledger's line is different:
it was admitted gated, and a gated pod cannot take `spec.nodeName`, so the placement adapter
(gpuledger.sync.placer) writes a required node affinity naming the one node the ledger chose and removes
the gate, and the default scheduler binds it there. Tests of that path start this scheduler for as long as
they need it (built like kube-apiserver:
`COMPONENTS=kube-scheduler bash devcluster/build_kube_components.sh`, or `make apiserver`).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from devcluster.binaries import ControlPlaneError, binary_path, workload_api_args
from devcluster.processes import stop_process

SCHEDULER = "kube-scheduler"


def scheduler_binary() -> Path:
    return binary_path(SCHEDULER)


class KubeScheduler:
    """One kube-scheduler process against a control plane (its admin kubeconfig), no leader election, no
    serving port: it only watches pods and nodes and binds."""

    def __init__(self, control_plane, workdir: Path | None = None):
        self.cp = control_plane
        self.workdir = Path(workdir or control_plane.workdir)
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "kube-scheduler.log"

    def start(self, timeout: float = 30.0) -> KubeScheduler:
        binary = scheduler_binary()
        if not binary.exists():
            raise ControlPlaneError(
                f"{binary} not built: COMPONENTS=kube-scheduler bash devcluster/build_kube_components.sh"
            )
        log = open(self.log_path, "ab")  # noqa: SIM115 - the process writes it for its whole life
        self.proc = subprocess.Popen(
            [
                str(binary),
                f"--kubeconfig={self.cp.kubeconfig}",
                f"--authentication-kubeconfig={self.cp.kubeconfig}",
                f"--authorization-kubeconfig={self.cp.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--bind-address=127.0.0.1",
                *workload_api_args("kube-scheduler"),
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        # it has no health port here (no serving): it is up once it has run a moment without exiting
        deadline = time.monotonic() + min(timeout, 2.0)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ControlPlaneError(f"kube-scheduler exited {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def __enter__(self) -> KubeScheduler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
