"""The pod-write layer changed who writes, not what is written: the webhook's JSON patches (placed and
waiting pods, every visibility and binding mode), its device-variable guard's view of them, and the
placement adapter's patch for a gated pod are the same as before the layer existed.

`same_writes.json` holds, per case, the sha256 (first 16 hex digits) of the canonical JSON (sorted keys,
compact) of what the adapters wrote for that case, recorded with the code from before gpuledger.podwrite; the
cases are drawn from a seeded random generator, so the same cases are drawn each run. Record again only for an
intended change of what is written: `python -m tests.podwrite.test_same_writes --record`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

from gpuledger.core.model import BindingMode, DeviceShare, Placement, Request, Taint
from gpuledger.names import SCHEDULING_GATE
from gpuledger.service.ledger_service import PlacedPod
from gpuledger.sync.placer import placement_patch, required_node
from gpuledger.webhook.admission import env_guard
from gpuledger.webhook.admission.patch import (
    apply_placement,
    apply_waiting,
    patch_of,
    shallow_pod,
    strip_ledger_keys,
    visibility_env,
    waiting_env,
)
from gpuledger.webhook.config import WebhookConfig

FIXTURE = Path(__file__).with_name("same_writes.json")
SEED = 20261202
CASES = {"placed": 1500, "waiting": 700, "placer": 900, "affinity": 400}
VISIBILITY = ("host-indices", "runtime-uuids", "device-plugin")
BINDING = tuple(BindingMode)
AFFINITY_KEYS = ("kubernetes.io/hostname", "metadata.name")
RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
NODES = ("node-a", "node-b", "n/1", "n~2")
TAINT_KEYS = ("gpu", "nvidia.com/gpu", "dedicated", "k~x")
EFFECTS = ("NoSchedule", "NoExecute", "PreferNoSchedule")


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    if isinstance(value, BindingMode):
        return value.value
    raise TypeError(f"not JSON: {value!r}")


def _maybe(rng: random.Random, p: float = 0.5) -> bool:
    return rng.random() < p


# ------------------------------------------------------------------------------------------- the inputs
def _env(rng: random.Random) -> list[dict]:
    out: list[dict] = []
    for _ in range(rng.randint(0, 4)):
        name = rng.choice(("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HOME", "OTHER"))
        if _maybe(rng, 0.2):
            out.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        else:
            out.append({"name": name, "value": rng.choice(("all", "0", "1,2", "void", "", "x"))})
    return out


def _container(rng: random.Random, i: int, resource: str) -> dict:
    c: dict[str, Any] = {"name": f"c{i}", "image": "busybox"}
    if _maybe(rng, 0.6):
        c["env"] = _env(rng)
    r = rng.random()
    if r < 0.5:
        where = rng.choice(("limits", "requests"))
        amount = rng.choice((1, 2, "1", "4", 0, "0"))
        c["resources"] = {where: {rng.choice((resource, "nvidia.com/gpu", "cpu")): amount}}
        if _maybe(rng, 0.3):
            c["resources"].setdefault("limits", {})["memory"] = "1Gi"
    elif r < 0.65:
        c["resources"] = {}
    return c


def _requirement(rng: random.Random) -> dict:
    key = rng.choice(("zone", "kubernetes.io/hostname", "metadata.name"))
    return {"key": key, "operator": rng.choice(("In", "NotIn")), "values": [rng.choice((*NODES, "z1"))]}


def _affinity(rng: random.Random, tolerant: bool) -> Any:
    """Pod affinities: absent, empty, other kinds only, or required node terms (some holding the node's
    requirement already); the webhook's pods may also hold odd shapes (`tolerant`)."""
    r = rng.random()
    if r < 0.25:
        return None
    if r < 0.32:
        return {}
    out: dict[str, Any] = {}
    if _maybe(rng, 0.3):
        out["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": []}
    if _maybe(rng, 0.85):
        node_affinity: dict[str, Any] = {}
        if _maybe(rng, 0.3):
            node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": 1, "preference": {"matchExpressions": [_requirement(rng)]}}
            ]
        if _maybe(rng, 0.85):
            terms = []
            for _ in range(rng.randint(0, 3)):
                term: dict[str, Any] = {}
                if _maybe(rng, 0.7):
                    term["matchExpressions"] = [_requirement(rng) for _ in range(rng.randint(0, 2))]
                if _maybe(rng, 0.3):
                    term["matchFields"] = [
                        {"key": "metadata.name", "operator": "In", "values": [rng.choice(NODES)]}
                    ]
                terms.append(term)
            required: dict[str, Any] = {"nodeSelectorTerms": terms} if _maybe(rng, 0.9) else {}
            node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
        out["nodeAffinity"] = node_affinity
    if tolerant and _maybe(rng, 0.05):
        out["nodeAffinity"] = rng.choice((None, [], "x"))
    return out


def _tolerations(rng: random.Random, operators: tuple) -> list[dict]:
    out = []
    for _ in range(rng.randint(0, 4)):
        t: dict[str, Any] = {}
        if _maybe(rng, 0.85):
            t["key"] = rng.choice(TAINT_KEYS)
        op = rng.choice(operators)
        if op is not None:
            t["operator"] = op
        if op != "Exists" and _maybe(rng, 0.6):
            t["value"] = rng.choice(("", "v", "true"))
        if _maybe(rng, 0.7):
            t["effect"] = rng.choice(EFFECTS)
        if _maybe(rng, 0.1):
            t["tolerationSeconds"] = 30
        out.append(t)
    return out


def _taints(rng: random.Random) -> tuple[Taint, ...]:
    return tuple(
        Taint(rng.choice(TAINT_KEYS), rng.choice(("", "v", "true")), rng.choice(EFFECTS))
        for _ in range(rng.choice((0, 0, 1, 2, 3)))
    )


def _metadata(rng: random.Random) -> dict:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "uid-1"}
    if _maybe(rng, 0.7):
        meta["annotations"] = dict.fromkeys(
            rng.sample(
                ("a", "gpuledger.io/placement", "gpuledger.io/waiting", "x/y", "t~z", "kubectl/last"),
                rng.randint(0, 4),
            ),
            "x",
        )
    if _maybe(rng, 0.6):
        meta["labels"] = dict.fromkeys(
            rng.sample(("app", "gpuledger.io/reservation-id", "tier"), rng.randint(0, 3)), "v"
        )
    return meta


def webhook_pod(rng: random.Random, resource: str) -> dict:
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": _metadata(rng)}
    if _maybe(rng, 0.03):
        return pod
    spec: dict[str, Any] = {
        "containers": [_container(rng, i, resource) for i in range(rng.randint(1, 3))],
    }
    if _maybe(rng, 0.3):
        spec["initContainers"] = [_container(rng, 10 + i, resource) for i in range(rng.randint(1, 2))]
    affinity = _affinity(rng, tolerant=True)
    if affinity is not None:
        spec["affinity"] = affinity
    if _maybe(rng, 0.6):
        spec["tolerations"] = _tolerations(rng, (None, "Equal", "Exists", "Exists", "Foo"))
    if _maybe(rng, 0.3):
        spec["nodeSelector"] = {"zone": "z1"}
    if _maybe(rng, 0.25):
        gates = [{"name": "other.io/gate"}] if _maybe(rng) else []
        if _maybe(rng):
            gates.insert(rng.randint(0, len(gates)), {"name": SCHEDULING_GATE})
        spec["schedulingGates"] = gates
    if _maybe(rng, 0.1):
        spec["nodeName"] = rng.choice(NODES)
    if _maybe(rng, 0.2):
        spec["schedulerName"] = "default-scheduler"
    pod["spec"] = spec
    return pod


def placement(rng: random.Random) -> Placement:
    devices = tuple(sorted(rng.sample(range(8), rng.randint(0, 4))))
    shares = tuple(
        DeviceShare(d, rng.choice((250, 500)), rng.choice((0, 1024)))
        for d in rng.sample(range(8), rng.choice((0, 0, 0, 1, 2)))
    )
    n = len(devices) + len(shares)
    r = rng.random()
    if r < 0.6:
        uuids = tuple(f"GPU-{i}" for i in range(n))
    elif r < 0.8:
        uuids = ()
    else:
        uuids = tuple(rng.choice(("", "GPU-x")) for _ in range(max(0, n + rng.choice((-1, 0, 1)))))
    return Placement(
        id=f"r{rng.randint(0, 99)}",
        node=rng.choice(NODES),
        devices=devices,
        shares=shares,
        uuids=uuids,
        tolerated_taints=_taints(rng),
    )


def request(rng: random.Random) -> Request:
    if _maybe(rng, 0.3):
        return Request(id="q", gpus=0, gpu_milli=rng.choice((0, 250)), gpu_memory_mib=rng.choice((0, 2048)))
    return Request(id="q", gpus=rng.randint(0, 4))


def stored_gated_pod(rng: random.Random) -> dict:
    """A waiting pod as the API server stores it (the placement adapter reads it back): valid shapes only."""
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": rng.choice(("uid-1", "uid-2"))}
    if _maybe(rng, 0.7):
        meta["annotations"] = {"gpuledger.io/waiting": "t", **({"a/b": "c"} if _maybe(rng) else {})}
    if _maybe(rng, 0.5):
        meta["labels"] = {"app": "x"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    affinity = _affinity(rng, tolerant=False)
    if affinity is not None:
        spec["affinity"] = affinity
    if _maybe(rng, 0.6):
        spec["tolerations"] = _tolerations(rng, (None, "Equal", "Exists"))
    gates = [{"name": f"other.io/g{i}"} for i in range(rng.randint(0, 2))]
    if _maybe(rng, 0.95):
        gates.insert(rng.randint(0, len(gates)), {"name": SCHEDULING_GATE})
    if gates:
        spec["schedulingGates"] = gates
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def placed_pod(rng: random.Random) -> PlacedPod:
    annotations = {"gpuledger.io/placement": "signed", "gpuledger.io/visible-devices": "GPU-1"}
    if _maybe(rng, 0.3):
        annotations["gpuledger.io/device~indices"] = "0,1"
    return PlacedPod(
        namespace="ns",
        name="p",
        uid="uid-1",
        reservation_id="r1",
        node=rng.choice(NODES),
        annotations=annotations,
        labels={"gpuledger.io/reservation-id": "r1"},
        waited_s=rng.random() * 10,
        tolerated_taints=_taints(rng),
    )


# ------------------------------------------------------------------------------------------- the writes
def _config(rng: random.Random) -> WebhookConfig:
    return WebhookConfig(
        binding_mode=rng.choice(BINDING),
        visibility_mode=rng.choice(VISIBILITY),
        affinity_key=rng.choice(AFFINITY_KEYS),
        gpu_resource=rng.choice(RESOURCES),
    )


def _guarded(placed: dict) -> list:
    return sorted([kind, i, value] for (kind, i), value in placed.items())


def placed_case(rng: random.Random) -> Any:
    config = _config(rng)
    pod = webhook_pod(rng, config.gpu_resource)
    result = placement(rng)
    original = copy.deepcopy(pod)
    work = shallow_pod(pod)
    removed = strip_ledger_keys(work)
    apply_placement(
        work,
        result,
        "signed-placement",
        binding_mode=config.binding_mode,
        visibility_mode=config.visibility_mode,
        affinity_key=config.affinity_key,
        gpu_resource=config.gpu_resource,
    )
    ops = patch_of(pod, work)
    assert pod == original, "the webhook wrote into the pod it was given"
    return {
        "removed": removed,
        "ops": ops,
        "work": work,
        "env": visibility_env(result, config.visibility_mode),
        "guard": _guarded(env_guard.placed_env(work, result, config)),
        "warnings": env_guard.replacements(pod, work, config.visibility_mode),
    }


def waiting_case(rng: random.Random) -> Any:
    config = _config(rng)
    pod = webhook_pod(rng, config.gpu_resource)
    asked = request(rng)
    original = copy.deepcopy(pod)
    work = shallow_pod(pod)
    strip_ledger_keys(work)
    apply_waiting(
        work, asked, "signed-ticket", visibility_mode=config.visibility_mode, gpu_resource=config.gpu_resource
    )
    ops = patch_of(pod, work)
    assert pod == original, "the webhook wrote into the pod it was given"
    return {
        "ops": ops,
        "work": work,
        "env": waiting_env(asked, config.visibility_mode),
        "guard": _guarded(env_guard.waiting_placed(work, asked, config)),
        "warnings": env_guard.replacements(pod, work, config.visibility_mode),
    }


def placer_case(rng: random.Random) -> Any:
    pod = stored_gated_pod(rng)
    placed = placed_pod(rng)
    original = copy.deepcopy(pod)
    try:
        out: Any = placement_patch(pod, placed, rng.choice(AFFINITY_KEYS))
    except ValueError as exc:
        out = {"error": str(exc)}
    assert pod == original, "the placement adapter wrote into the pod it read"
    return out


def affinity_case(rng: random.Random) -> Any:
    affinity = _affinity(rng, tolerant=False)
    before = copy.deepcopy(affinity)
    out = required_node(affinity, rng.choice(NODES), rng.choice(AFFINITY_KEYS))
    assert affinity == before
    return out


MAKERS = {"placed": placed_case, "waiting": waiting_case, "placer": placer_case, "affinity": affinity_case}


def digests() -> dict[str, list[str]]:
    out = {}
    for kind, count in CASES.items():
        rng = random.Random(f"{SEED}-{kind}")
        out[kind] = [digest(MAKERS[kind](rng)) for _ in range(count)]
    return out


def test_the_adapters_write_what_they_wrote_before_the_pod_write_layer():
    recorded = json.loads(FIXTURE.read_text())
    now = digests()
    assert set(now) == set(recorded)
    for kind, expected in recorded.items():
        differ = [i for i, (a, b) in enumerate(zip(expected, now[kind], strict=True)) if a != b]
        assert not differ, f"{kind}: {len(differ)} of {len(expected)} cases differ, first {differ[:10]}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        FIXTURE.write_text(json.dumps(digests(), indent=0) + "\n")
        print(f"recorded {sum(CASES.values())} cases in {FIXTURE}")
