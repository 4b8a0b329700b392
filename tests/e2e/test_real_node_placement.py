"""gpuledger placing pods on a real node, in `device-plugin` mode, with the node lifecycle controller running.

A control plane of this module's own: its only node is real (kubelet + containerd + the fake GPU plugin), so
kube-controller-manager may run the node lifecycle controller (a dead kubelet makes its Node NotReady) without
tainting the shared control plane's kubelet-less fake nodes. The product runs against it as in the rest of
tests/e2e (`Stack`: Ray ledger, cluster sync, TLS webhook), binding by `nodeName` (no scheduler runs) in
`device-plugin` mode, the manifests' default: the ledger chooses the node and the count, the kubelet and the
plugin choose the devices.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from devcluster.agent_process import AgentProcess
from devcluster.cluster import (
    ALICE,
    CONTROLLERS,
    NODE_LIFECYCLE_CONTROLLER,
    ControlPlane,
    node_lifecycle_args,
)
from devcluster.device_plugin import FakeGPUPlugin
from devcluster.kubelet import RealNode
from devcluster.nodes import device_uuid
from devcluster.stack import Stack, e2e_webhook_config, placements_by_device
from tests.conftest import require_binaries, require_real_node
from tests.e2e.conftest import busybox_pod

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.ray, pytest.mark.slow]

NODE = "real-node-placed"
GPUS = 16
GRACE_S = 12  # --node-monitor-grace-period: the kubelet renews its lease every 2 s (RealNode.node_lease_s 8)
FAILING = 4  # pods exiting 1 whose freeing is timed
# 1-GPU pods that go through the node in the race test: 200 took 97 s on the shared 2-core machine (load
# 7-10), so the suite runs 100 (about 50 s); GPULEDGER_RACE_PODS=200 runs the full race
RACE_PODS = int(os.environ.get("GPULEDGER_RACE_PODS", "100"))
RACE_EXTRA = 4  # each wave creates this many pods more than the ledger has GPUs free: they race for them
PRINT_ENV = "echo CUDA=$CUDA_VISIBLE_DEVICES NV=$NVIDIA_VISIBLE_DEVICES"
HOLD = f"{PRINT_ENV}; trap 'exit 0' TERM; sleep 3600 & wait"


@pytest.fixture(scope="module")
def placed():
    """Control plane (with node lifecycle) + real node with GPUS fake GPUs + the product, for the module."""
    require_binaries()
    require_real_node()
    started = time.monotonic()
    lifecycle = node_lifecycle_args(GRACE_S)
    cp = ControlPlane(controllers=(*CONTROLLERS, NODE_LIFECYCLE_CONTROLLER), extra_controller_args=lifecycle)
    with (
        cp,
        RealNode(cp, name=NODE, index=1) as node,
        FakeGPUPlugin([device_uuid(NODE, i) for i in range(GPUS)]) as plugin,
    ):
        cp.wait_for(lambda: _schedulable(cp, GPUS), timeout=60, what=f"{NODE} Ready, untainted, {GPUS} GPUs")
        # when_full refuse: the race is between pods refused when full, as the rest of the suite's stack
        # (tests/e2e/test_real_node_waiting.py places pods after waiting on a real node)
        config = e2e_webhook_config(binding_mode="both", visibility_mode="device-plugin", when_full="refuse")
        with Stack(cp, config=config) as stack:
            print(
                f"\nplacement module: control plane, real node, plugin and product up in "
                f"{time.monotonic() - started:.1f}s (logs: {node.kubelet_log})"
            )
            yield cp, node, plugin, stack


@pytest.fixture
def ns(placed):
    cp = placed[0]
    name = cp.create_namespace(f"rn-{uuid.uuid4().hex[:6]}")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _schedulable(cp, gpus: int):
    """The node Ready, without taints (the lifecycle controller's not-ready/unreachable ones lifted) and with
    `gpus` GPUs allocatable: what the ledger needs to place there."""
    node = cp.get_json("node", NODE)
    conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
    ready = conditions.get("Ready") == "True" and not node["spec"].get("taints")
    return ready and node["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(gpus)


def gpu_pod(name: str, command: str, gpus: int = 1, annotations: dict | None = None) -> dict:
    """A pod as a user writes it: a GPU count and a node selector; gpuledger adds the node and the limits."""
    return busybox_pod(name, command, gpus, host=NODE, annotations=annotations or {})


def create(cp, ns: str, obj: dict, check: bool = True, dry_run: bool = False):
    extra = ["--dry-run=server"] if dry_run else []
    return cp.kubectl(
        "create", "-n", ns, *extra, "-f", "-", input=yaml.safe_dump(obj), as_user=ALICE, check=check
    )


def wait_phase(cp, ns: str, name: str, phases=("Succeeded", "Failed"), timeout: float = 60) -> dict:
    def reached():
        pod = cp.get_json("pod", name, "-n", ns)
        return pod if pod["status"].get("phase") in phases else None

    return cp.wait_for(reached, timeout=timeout, interval=0.2, what=f"pod {ns}/{name} {'/'.join(phases)}")


def held(stack: Stack, ids: list[str]) -> list:
    return stack.call("lookup", ids)


def test_device_plugin_mode_pod_sees_the_devices_pod_resources_reports(placed, ns):
    cp, node, plugin, stack = placed
    create(cp, ns, gpu_pod("holds-two", HOLD, gpus=2))
    pod = wait_phase(cp, ns, "holds-two", ("Running",))
    placement = stack.placement(pod)
    assert placement is not None and placement.node == NODE and len(placement.devices) == 2
    assert pod["spec"]["nodeName"] == NODE
    printed = cp.wait_for(lambda: cp.kubectl("logs", "-n", ns, "holds-two").stdout, what="the pod's output")
    devices = node.pod_devices()[(ns, "holds-two", "main")]
    assert len(devices) == 2 and set(devices) <= set(plugin.health)
    # the plugin's Allocate sets NVIDIA_VISIBLE_DEVICES; the webhook writes no device env in this mode.
    # PodResources lists a container's devices as a set (any order), Allocate in the order it answered
    cuda, nv = printed.strip().split(" ")
    assert cuda == "CUDA=" and sorted(nv.removeprefix("NV=").split(",")) == sorted(devices)
    assert nv.removeprefix("NV=").split(",") in plugin.allocations
    assert stack.call("lookup", [placement.id])[0].confirmed


def test_job_pods_complete_and_free_their_gpus(placed, ns):
    cp, _, _, stack = placed
    template = gpu_pod("unused", "echo trained")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "parallelism": 3,
            "completions": 3,
            "backoffLimit": 0,
            "template": {"metadata": {}, "spec": template["spec"]},
        },
    }
    create(cp, ns, job)
    cp.wait_for(
        lambda: cp.get_json("job", "train", "-n", ns)["status"].get("succeeded") == 3,
        timeout=90,
        what="Job train: 3 pods succeeded",
    )
    pods = cp.pods(ns, "job-name=train")
    ids = [stack.placement(p).id for p in pods]
    assert len(set(ids)) == 3 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    assert {stack.placement(p).node for p in pods} == {NODE}
    cp.wait_for(lambda: held(stack, ids) == [None] * 3, timeout=30, what="the Job's 3 GPUs freed")


def test_pods_exiting_1_fail_and_their_gpus_are_freed_within_the_sync_bound(placed, ns):
    """FAILING pods exit 1 at about the same time; for each, the time from the first poll that reads its phase
    Failed to the first ledger lookup that no longer holds its reservation (both polled together, every
    10 ms): the kubelet's status write reaching the watch, the sync's batch and one `apply_events` call."""
    cp, _, _, stack = placed
    core = _core(cp)
    names = [f"fails-{i}" for i in range(FAILING)]
    for name in names:
        create(cp, ns, gpu_pod(name, "sleep 2; exit 1", gpus=2))
    ids = {name: stack.placement(cp.get_json("pod", name, "-n", ns)).id for name in names}
    failed_at: dict[str, float] = {}
    freed_at: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while len(freed_at) < len(names) and time.monotonic() < deadline:
        raw = core.list_namespaced_pod(ns, _preload_content=False)  # JSON, not slow client models
        phases = {p["metadata"]["name"]: p["status"].get("phase") for p in json.loads(raw.data)["items"]}
        holding = dict(zip(names, held(stack, [ids[n] for n in names]), strict=True))
        now = time.monotonic()
        for name in names:
            if phases.get(name) == "Failed":
                failed_at.setdefault(name, now)
            if holding[name] is None and name in failed_at:  # freed after being read Failed, or this poll
                freed_at.setdefault(name, now)
        time.sleep(0.01)
    assert set(freed_at) == set(names), f"GPUs of {set(names) - set(freed_at)} not freed within 60 s"
    for name in names:
        pod = cp.get_json("pod", name, "-n", ns)
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    lags = sorted(round(1000 * (freed_at[n] - failed_at[n])) for n in names)
    print(f"\nfailed pods: GPUs freed {lags} ms after phase Failed was read (poll resolution ~20 ms)")


def test_dead_kubelet_makes_the_node_not_ready_and_gpuledger_stops_placing_there(placed, ns):
    cp, node, plugin, _ = placed
    pinned = {"gpu-scheduling-map": f"0={NODE}:0"}
    node.kill_kubelet()
    killed = time.monotonic()
    try:
        cp.wait_for(
            lambda: _condition(cp, "Ready") not in (None, "True"),
            timeout=GRACE_S + 30,
            interval=0.5,
            what=f"{NODE} NotReady after its kubelet died",
        )
        not_ready = time.monotonic()
        denied = cp.wait_for(
            lambda: (lambda p: p if p.returncode else None)(
                create(cp, ns, gpu_pod("probe", "true"), check=False, dry_run=True)
            ),
            timeout=30,
            what="gpuledger denying a pod that fits only the NotReady node",
        )
        assert "not ready" in denied.stderr, denied.stderr
        denied_pinned = create(cp, ns, gpu_pod("pinned-0", "true", annotations=pinned), check=False)
        assert denied_pinned.returncode != 0
        assert f"node {NODE}: node not ready" in denied_pinned.stderr, denied_pinned.stderr
        assert not cp.pods(ns), "a denied pod was stored"
        print(
            f"\nkubelet killed: Node NotReady after {not_ready - killed:.1f}s, "
            f"gpuledger denying {time.monotonic() - not_ready:.1f}s later:\n  {denied.stderr.strip()}"
            f"\n  {denied_pinned.stderr.strip()}"
        )
    finally:
        before = plugin.registrations
        node.restart_kubelet()
    cp.wait_for(lambda: plugin.registrations > before, timeout=30, what="the plugin registering again")
    cp.wait_for(lambda: _schedulable(cp, GPUS), timeout=60, what=f"{NODE} Ready and untainted again")
    admitted = cp.wait_for(
        lambda: (lambda p: p if p.returncode == 0 else None)(
            create(cp, ns, gpu_pod("back-0", PRINT_ENV, annotations=pinned), check=False)
        ),
        timeout=30,
        what="gpuledger placing on the node again",
    )
    assert admitted.returncode == 0
    done = wait_phase(cp, ns, "back-0")
    assert done["status"]["phase"] == "Succeeded" and done["spec"]["nodeName"] == NODE


def test_pods_racing_for_the_gpus_never_share_a_device(placed, ns):
    """RACE_PODS short 1-GPU pods go through the node in waves of (free GPUs + RACE_EXTRA) concurrent creates:
    the ledger admits at most what is free, the rest are denied and retried in a later wave. Meanwhile
    PodResources is polled (no device id in two running pods) and so are the stored pods' placements (no
    device of the ledger's in two live pods)."""
    cp, node, _, stack = placed
    core = _core(cp)
    violations: list[str] = []
    peak = {"running": 0, "polls": 0}
    stop = threading.Event()

    def still_running(keys: list) -> list:
        """The holders the API does not show finished: PodResources lists a pod that has just exited (and
        whose device the kubelet has given to the next pod) until the kubelet forgets it."""
        out = []
        for key in keys:
            try:
                phase = core.read_namespaced_pod_status(key[1], key[0]).status.phase
            except ApiException:
                continue  # gone
            if phase not in ("Succeeded", "Failed"):
                out.append(key)
        return out

    def watch_pod_resources():
        polls = 0
        seen_twice: dict[str, tuple] = {}  # a device two holders shared at the last poll
        while not stop.is_set():
            owners: dict[str, list] = {}
            holding = 0
            for key, devices in node.pod_devices().items():
                holding += bool(devices) and key[0] == ns
                for d in devices:
                    owners.setdefault(d, []).append(key)
            shared = {d: tuple(sorted(o)) for d, o in owners.items() if len(o) > 1}
            for d, o in shared.items():  # on two polls in a row, by pods that are not finished: a violation
                if seen_twice.get(d) == o and len(still_running(list(o))) > 1:
                    violations.append(f"PodResources: {d} held by {list(o)}")
            seen_twice = shared
            peak["running"] = max(peak["running"], holding)
            polls += 1
            peak["polls"] = polls
            if polls % 5 == 0:  # the stored pods' placements: a list of every pod, so less often
                raw = core.list_namespaced_pod(ns, _preload_content=False)  # JSON, not slow client models
                live = json.loads(raw.data)["items"]
                violations.extend(
                    f"ledger: {dev} placed for {names}"
                    for dev, names in placements_by_device(stack, live).items()
                    if len(names) > 1
                )
            stop.wait(0.1)

    def try_create(i: int) -> bool:
        body = gpu_pod(f"race-{i}", "sleep 1")
        try:
            core.create_namespaced_pod(ns, body)
            return True
        except ApiException as e:
            if "denied the request" not in str(e.body):
                raise
            return False

    watcher = threading.Thread(target=watch_pod_resources, daemon=True)
    watcher.start()
    started = time.monotonic()
    admitted, denied, serial = 0, 0, 0
    try:
        with ThreadPoolExecutor(GPUS + RACE_EXTRA) as pool:
            while admitted < RACE_PODS and time.monotonic() - started < 240:
                free = _free_gpus(stack)
                if free == 0:
                    time.sleep(0.1)
                    continue
                wave = min(free + RACE_EXTRA, RACE_PODS - admitted + RACE_EXTRA)
                results = list(pool.map(try_create, range(serial, serial + wave)))
                serial += wave
                admitted += sum(results)
                denied += results.count(False)
        assert admitted >= RACE_PODS, f"only {admitted} pods admitted in 240 s"

        def finished():
            pods = cp.pods(ns)
            return pods if all(p["status"].get("phase") in ("Succeeded", "Failed") for p in pods) else None

        pods = cp.wait_for(finished, timeout=120, interval=0.5, what="every race pod finished")
    finally:
        stop.set()
        watcher.join(10)
    took = time.monotonic() - started
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
    failed = {n: ph for n, ph in phases.items() if ph != "Succeeded"}
    print(
        f"\nrace: {admitted} pods admitted and run, {denied} creates denied, in {took:.0f}s; "
        f"at most {peak['running']} pods holding devices at once, {peak['polls']} PodResources polls"
    )
    assert not violations, violations[:10]
    assert not failed, {n: _reason(cp, ns, n) for n in list(failed)[:5]}
    assert peak["polls"] > 10
    cp.wait_for(lambda: _free_gpus(stack) == GPUS, timeout=30, what=f"all {GPUS} GPUs free in the ledger")


# ------------------------------------------------------------------- the node agent's truth (device-plugin)
@pytest.fixture
def agent(placed):
    """The real node agent on the real node: PodResources -> agentaflow.gpu/device-holders -> the ledger."""
    cp, node, _, _ = placed
    with AgentProcess(cp.kubeconfig, node, GPUS) as running:
        yield running


def _ledger_devices(stack: Stack, rid: str) -> set[int]:
    """The devices the ledger records for reservation `rid` on NODE (its canonical snapshot)."""
    return {d[0] for d in stack.call("snapshot")["nodes"][NODE]["devices"] if d[3] == rid}


def _truth_devices(stack: Stack) -> set[int]:
    return {d[0] for d in stack.call("snapshot")["nodes"][NODE]["devices"] if d[3] == f"truth:{NODE}"}


def _printed_indices(cp, ns: str, name: str) -> set[int]:
    printed = cp.wait_for(lambda: cp.kubectl("logs", "-n", ns, name).stdout, what=f"{name}'s output")
    uuids = printed.strip().split(" ")[1].removeprefix("NV=").split(",")
    by_uuid = {device_uuid(NODE, i): i for i in range(GPUS)}
    return {by_uuid[u] for u in uuids}


def test_the_ledger_records_the_devices_the_kubelet_gave(placed, ns, agent):
    """device-plugin mode: gpuledger picks the node and the count, the kubelet the devices; with the node
    agent reading PodResources the ledger's record becomes exactly what the container printed."""
    cp, _, _, stack = placed
    names = ["truth-a", "truth-b", "truth-c"]
    for name in names:
        create(cp, ns, gpu_pod(name, HOLD, gpus=2))
    for name in names:
        pod = wait_phase(cp, ns, name, ("Running",))
        rid = stack.placement(pod).id
        printed = _printed_indices(cp, ns, name)
        assert len(printed) == 2
        cp.wait_for(
            lambda rid=rid, printed=printed: (agent.check_alive(), _ledger_devices(stack, rid) == printed)[1],
            timeout=30,
            what=f"the ledger recording {name}'s devices as the kubelet gave them ({sorted(printed)})",
        )
    status = stack.call("status")
    corrected = {c[1] for c in status.get("device_corrections", [])}
    for name in names:
        pod = cp.get_json("pod", name, "-n", ns)
        placement = stack.placement(pod)
        if set(placement.devices) != _ledger_devices(stack, placement.id):  # the kubelet chose otherwise
            assert placement.id in corrected
    cp.kubectl("delete", "pod", "--all", "-n", ns, "--wait=true", "--timeout=60s")
    cp.wait_for(lambda: _free_gpus(stack) == GPUS, timeout=30, what=f"all {GPUS} GPUs free in the ledger")


def test_a_foreign_device_plugin_pod_holds_its_devices_by_identity(placed, ns, agent):
    """A pod of a namespace that is not opted in takes GPUs through the plugin alone: the ledger holds exactly
    those devices for it (not a per-node count), and never records them for its own pods."""
    cp, node, _, stack = placed
    plain = cp.create_namespace(f"rn-plain-{uuid.uuid4().hex[:6]}", admission=False)
    try:
        foreign = gpu_pod("foreign", HOLD, gpus=3)
        foreign["spec"]["nodeName"] = (
            NODE  # no scheduler runs: bound by hand, as the stock plugin's users are
        )
        create(cp, plain, foreign)
        wait_phase(cp, plain, "foreign", ("Running",))
        taken = _printed_indices(cp, plain, "foreign")
        cp.wait_for(
            lambda: (agent.check_alive(), _truth_devices(stack) == taken)[1],
            timeout=30,
            what=f"the ledger holding {sorted(taken)} for the foreign pod by identity",
        )
        assert stack.call("snapshot")["nodes"][NODE]["unknown_gpus"] == 0  # not counted a second time
        names = [f"own-{i}" for i in range((GPUS - len(taken)) // 2)]
        for name in names:
            create(cp, ns, gpu_pod(name, HOLD, gpus=2))
        ids = [stack.placement(wait_phase(cp, ns, n, ("Running",))).id for n in names]
        for name, rid in zip(names, ids, strict=True):
            printed = _printed_indices(cp, ns, name)
            assert not printed & taken
            cp.wait_for(
                lambda rid=rid, printed=printed: _ledger_devices(stack, rid) == printed,
                timeout=30,
                what=f"{name} recorded on the devices it got",
            )
        assert _truth_devices(stack) == taken
        holders: dict[str, list] = {}
        for key, devices in node.pod_devices().items():
            for device in devices:
                holders.setdefault(device, []).append(key)
        assert all(len(v) == 1 for v in holders.values()), holders
        # one more GPU than the node has free is denied, never placed on the foreign pod's devices
        over = create(
            cp, ns, gpu_pod("too-many", HOLD, gpus=GPUS - len(taken) - 2 * len(names) + 1), check=False
        )
        assert over.returncode != 0 and "node(s)" in over.stderr
    finally:
        cp.force_delete("pods", namespace=plain)
        cp.kubectl("delete", "namespace", plain, "--wait=false", check=False)
        cp.kubectl("delete", "pod", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False)


# ---------------------------------------------------------------------------------------------- helpers
def _core(cp):
    from kubernetes import client

    return client.CoreV1Api(cp.api_client(ALICE))


def _condition(cp, kind: str) -> str | None:
    node = cp.get_json("node", NODE)
    return {c["type"]: c["status"] for c in node["status"].get("conditions", [])}.get(kind)


def _free_gpus(stack: Stack) -> int:
    node = stack.call("snapshot")["nodes"].get(NODE)
    if node is None:
        return 0
    return sum(1 for d in node["devices"] if d[3] is None) - node["unknown_gpus"]


def _reason(cp, ns: str, name: str) -> str:
    pod = cp.get_json("pod", name, "-n", ns)
    status = pod["status"]
    return f"{status.get('phase')} {status.get('reason')}: {status.get('message')}"
