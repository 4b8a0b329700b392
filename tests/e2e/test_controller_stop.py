"""`gpuledger controller` stops at once on SIGTERM in every phase, and its probes mean something.

The real controller as its own process, on the real apiserver and the stack's Ray ledger actor: SIGTERM while
it waits for the ledger actor, while it waits for the Lease as a standby, while it starts kopf as the new
leader, and once kopf's handlers run; each time it exits 0 within STOP_S. Its /healthz answers only while its
event loop runs (a SIGSTOPped controller's times out), and its /readyz says ready for a standby and a leader.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.e2e.test_gpuworkloads import ControllerProcess, _metric

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STOP_S = 2.0


class Controller(ControllerProcess):
    """A ControllerProcess with its probe server on a port of its own."""

    def __init__(self, cp, stack, namespace: str, identity: str, lease: str, *extra: str):
        held = socket.socket()  # held while the metrics port is chosen, so that the two differ
        held.bind(("127.0.0.1", 0))
        self.health_port = held.getsockname()[1]
        try:
            super().__init__(
                cp, stack, namespace, identity, lease, "--liveness-port", str(self.health_port), *extra
            )
        finally:
            held.close()

    def probe(self, path: str, timeout: float = 2.0) -> tuple[int, str] | None:
        """(status, body), or None when nothing answers in time."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except (OSError, TimeoutError):
            return None

    def wait_log(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {text!r}:\n{self.log()}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout}s:\n{self.log()[-4000:]}"
            time.sleep(0.02)

    def sigterm(self) -> float:
        """Send SIGTERM; the seconds until the process exited (it must exit 0 within STOP_S)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_S + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.identity} still runs {STOP_S + 10}s after SIGTERM:\n{self.log()[-4000:]}")
        took = time.monotonic() - started
        assert code == 0, f"{self.identity} exited {code}:\n{self.log()[-4000:]}"
        return took


@pytest.fixture
def start(apiserver, stack, namespace):
    started: list[Controller] = []
    lease = f"stop-{uuid.uuid4().hex[:6]}"

    def start_one(identity: str, *extra: str, lease_name: str = lease) -> Controller:
        proc = Controller(apiserver, stack, namespace, identity, lease_name, *extra)
        started.append(proc)
        return proc

    yield start_one
    for proc in started:
        if proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGCONT)
        proc.stop()
        tail = proc.log_path.read_text(errors="replace")[-3000:]
        print(f"--- controller {proc.identity} log (tail) ---\n{tail}")


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} in {timeout}s"
        time.sleep(0.05)


def test_sigterm_while_waiting_for_the_ledger_actor(start):
    ctl = start("no-ledger", "--actor-name", f"absent-{uuid.uuid4().hex[:6]}")
    ctl.wait_log("waiting for the ledger actor")
    took = ctl.sigterm()
    print(f"stop while waiting for the ledger actor: {took:.2f}s")
    assert took < STOP_S


@pytest.mark.parametrize("after", ["leader", "starting kopf"])
def test_sigterm_while_starting_kopf(start, after):
    """SIGTERM as soon as it says it leads (it lists the workloads, then starts kopf), or as soon as it says
    it starts kopf (kopf's login and start-up handlers, its watches not up yet)."""
    ctl = start(f"starting-{after.split()[0]}")
    ctl.wait_log(f"{ctl.identity}: {after}")
    took = ctl.sigterm()
    reached = "kopf running" if f"{ctl.identity}: kopf running" in ctl.log() else "kopf not yet running"
    print(f"stop right after {after!r} ({reached}): {took:.2f}s")
    assert took < STOP_S


def test_sigterm_while_kopf_runs(start):
    ctl = start("running")
    ctl.wait_log(f"{ctl.identity}: kopf running")
    # kopf's watches deliver the nodes to the engine, whose reconcile passes count in its metrics
    _wait_for(
        lambda: (_metric(ctl, "warp_gpuworkload_reconcile_duration_seconds_count") or 0) >= 1,
        60,
        "reconcile pass",
    )
    assert ctl.probe("/readyz") == (200, "leader, kopf running\n")
    took = ctl.sigterm()
    print(f"stop while kopf runs: {took:.2f}s")
    assert took < STOP_S


def test_standby_probes_and_sigterm_while_waiting_for_the_lease(start):
    leader = start("lead")
    leader.wait_log(f"{leader.identity}: kopf running")
    standby = start("standby", lease_name=_lease_of(leader))
    standby.wait_log("waiting for lease")
    # a standby answers both probes: alive, and ready (it reaches the API server and the ledger)
    assert _wait_for(lambda: standby.probe("/healthz"), 30, "standby /healthz") == (200, "ok\n")
    assert _wait_for(
        lambda: (lambda got: got if got and got[0] == 200 else None)(standby.probe("/readyz")),
        30,
        "standby ready",
    ) == (200, "standby, waiting for the Lease\n")
    assert not standby.is_leader()
    took = standby.sigterm()
    print(f"stop of a standby waiting for the Lease: {took:.2f}s")
    assert took < STOP_S
    took = leader.sigterm()
    print(f"stop of its leader: {took:.2f}s")
    assert took < STOP_S


def test_healthz_times_out_while_the_controller_is_frozen(start):
    """SIGSTOP freezes the process, its event loop with it: /healthz then answers nothing, as the kubelet's
    liveness probe would see a stuck controller; after SIGCONT it answers again."""
    ctl = start("frozen")
    ctl.wait_log(f"{ctl.identity}: kopf running")
    assert ctl.probe("/healthz") == (200, "ok\n")
    ctl.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert ctl.probe("/healthz", timeout=1.5) is None
        assert time.monotonic() - started >= 1.4  # a timeout, not a refused connection
    finally:
        ctl.proc.send_signal(signal.SIGCONT)
    assert _wait_for(lambda: ctl.probe("/healthz"), 10, "/healthz after SIGCONT") == (200, "ok\n")
    took = ctl.sigterm()
    print(f"stop after SIGSTOP/SIGCONT: {took:.2f}s")
    assert took < STOP_S


def _lease_of(ctl: Controller) -> str:
    return ctl.proc.args[ctl.proc.args.index("--lease-name") + 1]
