"""Day-two load on a deployed gpuledger: alice creating 1-GPU pods all along while an operator disrupts the
install, each create counted as it ended (admitted; refused, when the API server reached no ready webhook
under failurePolicy Fail; denied, the ledger's answer), and once the pods have run, each pod the kubelet
refused for want of a free GPU counted double-booked."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import yaml

from devcluster.cluster import ALICE
from tests.e2e.conftest import busybox_pod

FINISHED = ("Succeeded", "Failed")


@dataclass
class Create:
    at: float  # time.monotonic() when kubectl returned
    name: str
    outcome: str  # admitted | refused | denied
    message: str = ""


@dataclass
class LoadReport:
    admitted: int
    refused: int
    denied: int
    admitted_after: int  # admitted once the disruption was over (`PodLoad.disruption_over`)
    double_booked: list[str]  # pods the kubelet refused (UnexpectedAdmissionError: no GPU free)
    refusal_window_s: float  # first to last refusal
    pods: list[dict] = field(repr=False)  # every pod of the namespace, finished
    denials: list[str] = field(repr=False)

    def counts(self) -> dict[str, int]:
        return {
            "admitted": self.admitted,
            "refused": self.refused,
            "denied": self.denied,
            "admitted after": self.admitted_after,
            "double-booked": len(self.double_booked),
        }


class PodLoad:
    """A thread creating `sleep 1` pods of one GPU named PREFIX-N in `namespace` as alice, one about every
    `pause_s` plus a kubectl round trip, from `with` until its end."""

    def __init__(self, cp, namespace: str, prefix: str, pause_s: float = 0.3):
        self.cp, self.namespace, self.prefix, self.pause_s = cp, namespace, prefix, pause_s
        self.creates: list[Create] = []
        self.over_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"load-{prefix}")

    def __enter__(self) -> PodLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            name = f"{self.prefix}-{index}"
            pod = yaml.safe_dump(busybox_pod(name, "sleep 1", gpus=1))
            made = self.cp.kubectl(
                "create", "-n", self.namespace, "-f", "-", input=pod, as_user=ALICE, check=False
            )
            if made.returncode == 0:
                self.creates.append(Create(time.monotonic(), name, "admitted"))
            elif "failed calling webhook" in made.stderr:
                self.creates.append(Create(time.monotonic(), name, "refused", made.stderr.strip()))
            else:
                self.creates.append(Create(time.monotonic(), name, "denied", made.stderr.strip()))
            index += 1
            self._stop.wait(self.pause_s)

    def admitted(self, since: float = 0.0) -> int:
        return sum(1 for c in list(self.creates) if c.outcome == "admitted" and c.at >= since)

    def wait_admitted(self, count: int, what: str, since: float = 0.0, timeout: float = 90) -> None:
        self.cp.wait_for(lambda: self.admitted(since) >= count, timeout=timeout, interval=0.5, what=what)

    def disruption_over(self) -> float:
        """Marks the disruption's end: creates ending from now count as after it."""
        self.over_at = time.monotonic()
        return self.over_at

    def settle(self, timeout: float = 180) -> LoadReport:
        """Once every pod of the namespace finished: the counts."""

        names = self.admitted_names()

        def finished():
            pods = [p for p in self.cp.pods(self.namespace) if p["metadata"]["name"] in names]
            done = [p for p in pods if p["status"].get("phase") in FINISHED]
            return pods if len(done) == len(names) else None

        what = f"every pod {self.prefix}-N admitted in {self.namespace} finished"
        pods = self.cp.wait_for(finished, timeout=timeout, interval=1, what=what)
        by_outcome = {
            o: [c for c in self.creates if c.outcome == o] for o in ("admitted", "refused", "denied")
        }
        refused_at = [c.at for c in by_outcome["refused"]]
        return LoadReport(
            admitted=len(by_outcome["admitted"]),
            refused=len(by_outcome["refused"]),
            denied=len(by_outcome["denied"]),
            admitted_after=self.admitted(self.over_at) if self.over_at is not None else 0,
            double_booked=[p["metadata"]["name"] for p in pods if p["status"]["phase"] != "Succeeded"],
            refusal_window_s=(refused_at[-1] - refused_at[0]) if refused_at else 0.0,
            pods=pods,
            denials=[c.message for c in by_outcome["denied"]],
        )

    def admitted_names(self) -> set[str]:
        return {c.name for c in self.creates if c.outcome == "admitted"}
