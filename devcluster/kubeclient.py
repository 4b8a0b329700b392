"""kubectl and the python client for one cluster, with the helpers tests use on it: namespaces with
RBAC, force deletes, pod listings and polling the API.

It talks to a cluster someone else started (ControlPlane, or a kubeconfig); it never starts or stops one.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from devcluster.users import ADMIN, ALICE
from gpuledger.names import ADMISSION_ENABLED, ADMISSION_LABEL


class KubectlError(RuntimeError):
    """A failed kubectl call, with its command line and stderr in the message (CalledProcessError has
    neither)."""

    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess):
        self.proc = proc
        self.stderr = proc.stderr
        super().__init__(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")


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
        labels = {ADMISSION_LABEL: ADMISSION_ENABLED} if admission else {}
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


class ExistingCluster(KubeClient):
    """A cluster someone else runs (the current kubeconfig): one identity for everything."""

    def __init__(self, kubeconfig: str | None = None):
        self.kubeconfig = (
            kubeconfig
            or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
            or str(Path.home() / ".kube" / "config")
        )
