"""Shared fixtures. The control plane harness lives in devcluster/; this file only wires it into pytest."""

from __future__ import annotations

import os
import uuid

import pytest

# Tests resolve strategy names through the core's registry, which is empty until the built-ins register
# (importing gpuledger.strategies does, as the service does): so each test file runs alone as in the suite.
import gpuledger.strategies  # noqa: F401
from devcluster.cluster import ControlPlane, missing_binaries
from tests.parts import missing_part

# Ray's head waits 30 s for its GCS to publish its port; two test workers and a real node on two cores have
# outlasted that once, so the tests' Rays wait as Ray waits for a RocksDB-backed GCS (its own override)
os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")

# the modules that run pods on the real node (marked `realnode`): the kubelet hard-codes its device-plugin
# folder and kube-proxy writes the host's iptables, so one real node runs at a time (devcluster/node_host.py)
REAL_NODE_MODULES = frozenset(
    f"tests/e2e/{name}.py"
    for name in (
        "test_deployed",
        "test_product_image",
        "test_real_node",
        "test_real_node_agent",
        "test_real_node_placement",
        "test_real_node_resize",
        "test_real_node_visibility",
        "test_real_node_waiting",
    )
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test` runs two pytest-xdist workers with `--dist loadfile`: each takes a whole test module at a
    time (its module-scoped control plane or deployed stack starts once), and every real-node module goes to
    the same worker, one after another, instead of waiting on the other worker's real node."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RealNodeModulesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "realnode" if module in REAL_NODE_MODULES else module

    return RealNodeModulesTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker: the collection, whose order is the order units of work are handed out, puts
    the longest first (the real node's modules, then those marked `slow`), so neither worker ends long after
    the other. A `realnode` module missing from REAL_NODE_MODULES is an error: it would run beside another."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("realnode") and module not in REAL_NODE_MODULES:
            raise pytest.UsageError(f"{module} is marked realnode: add it to REAL_NODE_MODULES")

    def rank(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("realnode") else 1 if item.get_closest_marker("slow") else 2

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
