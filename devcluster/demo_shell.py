"""What the demo shows of itself: a heading per part, and the commands a user would type, run for real and
printed with their output, so that each part can be seen again by hand against the kept cluster.

Every wait is bounded and fails with a ControlPlaneError naming what it waited for and what it saw: CI runs
the demo, and a part whose story does not happen fails it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from devcluster.binaries import REPO, ControlPlaneError
from devcluster.kubeclient import KubeClient

MAX_CREATED_LINES = 4


class DemoShell:
    """kubectl and gpuledger against the demo's cluster, each command echoed as `$ ...` with its output."""

    def __init__(self, kube: KubeClient, workdir: Path, out: TextIO = sys.stdout):
        self.kube, self.workdir, self.out = kube, workdir, out

    def heading(self, number: int, title: str, story: str) -> None:
        print(f"\n== {number}. {title}\n{story}\n", file=self.out, flush=True)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def write(self, name: str, objects: list[dict]) -> Path:
        """A manifest the user can apply again: kept in the demo's directory."""
        path = self.workdir / name
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        return path

    def _echo(self, argv: list[str], stdout: str, shown: str | None) -> None:
        """The command, then its output indented; a long list of `created` lines is shortened."""
        print("$ " + (shown or " ".join(shlex.quote(a) for a in argv)), file=self.out)
        lines = stdout.rstrip("\n").splitlines()
        if len(lines) > MAX_CREATED_LINES and all(line.endswith(" created") for line in lines):
            lines = [*lines[:2], f"... ({len(lines) - 3} more)", lines[-1]]
        for line in lines:
            print("  " + line, file=self.out)
        print(file=self.out, flush=True)

    def kubectl(self, *args: str, as_user: str | None = None, shown: str | None = None) -> str:
        """Run `kubectl ARGS` (as `as_user`, with the demo's kubeconfig) and print it; fail on an error."""
        proc = self.kube.kubectl(*args, as_user=as_user, check=False)
        if proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        self._echo(["kubectl", *args], proc.stdout, shown)
        return proc.stdout

    def gpuledger(self, *args: str, shown: str | None = None, echo: bool = True) -> str:
        """Run the `gpuledger` command line as a user would (its own process, KUBECONFIG set) and print it
        (with its output unless `echo` is false: the caller prints what matters of it)."""
        env = dict(os.environ, KUBECONFIG=self.kube.kubeconfig, COLUMNS="200", NO_COLOR="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        proc = subprocess.run(
            [sys.executable, "-m", "gpuledger", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.workdir,
            timeout=120,
        )
        if proc.returncode != 0:
            raise ControlPlaneError(
                f"gpuledger {' '.join(args)} exited {proc.returncode}: {proc.stderr or proc.stdout}"
            )
        self._echo(["gpuledger", *args], proc.stdout if echo else "", shown)
        return proc.stdout


def wait(kube: KubeClient, predicate: Callable[[], Any], what: str, timeout: float = 90.0, **context) -> Any:
    """`predicate`'s first truthy value, or a ControlPlaneError naming what was awaited and `context`'s
    callables' values (what the cluster shows at the deadline)."""
    try:
        return kube.wait_for(predicate, timeout=timeout, interval=0.3, what=what)
    except TimeoutError as err:
        seen = "\n".join(f"{name}: {read()}" for name, read in context.items())
        raise ControlPlaneError(f"{err}\n{seen}".rstrip()) from None


def gpus_held(stack) -> int:
    """GPUs the ledger holds for anyone (placements, reservations, plans' keeps)."""
    nodes = stack.call("snapshot")["nodes"]
    return sum(1 for n in nodes.values() for d in n["devices"] if d[3] is not None or d[4])


def empty_namespace(kube: KubeClient, stack, namespace: str) -> None:
    """Delete every workload and pod of `namespace` (their kubelet ends them) until the ledger holds no
    GPU."""
    kube.kubectl("delete", "jobs,deployments", "--all", "-n", namespace, "--wait=false", check=False)
    kube.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
    wait(
        kube,
        lambda: not kube.pods(namespace) and gpus_held(stack) == 0,
        f"namespace {namespace} empty and every GPU free",
        pods=lambda: [p["metadata"]["name"] for p in kube.pods(namespace)],
        held=lambda: gpus_held(stack),
    )
