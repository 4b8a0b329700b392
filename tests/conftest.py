"""Shared fixtures. The control plane harness lives in devcluster/; this file only wires it into pytest."""

from __future__ import annotations

import uuid

import pytest

# Tests resolve strategy names through the core's registry, which is empty until the built-ins register
# (importing gpuledger.strategies does, as the service does): so each test file runs alone as in the suite.
import gpuledger.strategies  # noqa: F401
from devcluster.cluster import ControlPlane, missing_binaries
from tests.parts import missing_part


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`), each test module is one unit of
    work, so its module-scoped control plane starts once; every `realnode` module shares one unit, since the
    real node's kubelet, containerd and kube-proxy use the host's paths and iptables one at a time. Units are
    ordered longest first (the real node's, then `slow` modules) so that neither worker ends long after the
    other."""
    if not config.pluginmanager.hasplugin("xdist") or config.getoption("dist", "no") == "no":
        return

    def unit(item: pytest.Item) -> str:
        return "realnode" if item.get_closest_marker("realnode") else item.nodeid.split("::")[0]

    def rank(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("realnode") else 1 if item.get_closest_marker("slow") else 2

    for item in items:
        item.add_marker(pytest.mark.xdist_group(unit(item)))
    order = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (rank(item), order[id(item)]))


def require_binaries(with_controllers: bool = True) -> None:
    """Missing binaries skip the test when pytest runs by hand (naming the command that builds them), and fail
    it in CI and under `make test`, where a skipped end-to-end suite would look like a green one."""
    missing = missing_binaries(with_controllers)
    if missing:
        message = f"control plane binaries missing ({', '.join(missing)}): run `make apiserver`"
        missing_part(message)


def require_real_node() -> None:
    """A real node's missing parts (kubelet, containerd, runc, CNI, root...) skip the test when pytest runs by
    hand and fail it in CI and under `make test`, as `require_binaries` does."""
    from devcluster.kubelet import missing_parts

    lacking = missing_parts()
    if lacking:
        message = "a real node needs: " + "; ".join(lacking)
        missing_part(message)


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
