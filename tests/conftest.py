"""Shared fixtures. The control plane harness lives in devcluster/; this file only wires it into pytest."""

from __future__ import annotations

import os
import uuid

import pytest

from devcluster.cluster import ControlPlane, missing_binaries


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binaries(with_controllers: bool = True) -> None:
    """Missing binaries skip the test locally (naming the command that builds them) and fail it in CI, where a
    skipped end-to-end suite would look like a green one."""
    missing = missing_binaries(with_controllers)
    if missing:
        message = f"control plane binaries missing ({', '.join(missing)}): run `make apiserver`"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)


def require_real_node() -> None:
    """A real node's missing parts (kubelet, containerd, runc, CNI, root...) skip the test locally and fail it
    in CI, as `require_binaries` does."""
    from devcluster.kubelet import missing_parts

    lacking = missing_parts()
    if lacking:
        message = "a real node needs: " + "; ".join(lacking)
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def apiserver():
    """etcd + kube-apiserver + workload controllers, shared by the whole session."""
    require_binaries()
    with ControlPlane() as cp:
        yield cp


@pytest.fixture
def namespace(apiserver, request):
    """A fresh namespace opted in to admission, where the user alice may create workloads."""
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:5]}"
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name)
    apiserver.create_namespace(name)
    yield name
    # the namespace controller deletes its objects; pods bound by nodeName need force (no kubelet confirms)
    apiserver.force_delete("pods", namespace=name)
    apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
