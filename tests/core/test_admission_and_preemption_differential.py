"""Seeded random clusters and pod streams through the ledger's admission with the line in mind and its
preemption pass, and through the service's admission, claims, resyncs and lifecycle: every answer (placements,
denials with their messages, waiting answers with their reasons), quota refusals, `explain`'s preemption
words, the waiting line in its order, the preemption plans held and their victims, refused evictions, the
service's lookups and claims, snapshots along the way, and the snapshot and plans of a ledger rebuilt from
the API objects at the end, digested and compared with the digests recorded before the admission rule and
the preemption pass left the ledger's facade and the service stopped keeping its own copy of what the books
hold. Any change to what the ledger decides or keeps shows as a changed digest.

The ledger's streams run two or three GPU queues with tight quotas over few nodes, so pods borrow, wait,
preempt by reclaim and by priority, meet PodDisruptionBudgets and `preemptionPolicy: Never`, and have their
plans recorded, carried out or refused.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from datetime import UTC, datetime

import pytest

import gpuledger.strategies  # noqa: F401  (the strategies register themselves)
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import GroupSpec, Placement, Request
from gpuledger.core.queues.waiting import Waiting
from gpuledger.names import PREEMPTING_ANNOTATION, QUEUE_LABEL
from gpuledger.service.ledger_service import AdmitCall, LedgerService
from tests.core.core_factory import node, pod
from tests.core.queues.test_queue_book import budget, gpu_queue, namespace
from tests.core.waiting_factory import gated_pod, placed_pod

KEY = b"admission-key"
TTL = 30.0
T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
NAMESPACES = ("ns-a", "ns-b", "ns-c")


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _World:
    """The API objects a stream stored, by kind/namespace/name, and the ledger that followed them."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.objects: dict[str, dict] = {}

    @staticmethod
    def key(obj: dict) -> str:
        meta = obj["metadata"]
        return f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"

    def apply(self, obj: dict, now: float) -> None:
        self.objects[self.key(obj)] = obj
        self.ledger.apply_object(obj, now)

    def delete(self, obj: dict) -> None:
        self.objects.pop(self.key(obj), None)
        self.ledger.delete_object(obj)


def _request(rng: random.Random, serial: int) -> Request:
    ns = rng.choice(NAMESPACES)
    name = f"p{serial}"
    priority = rng.choice((0, 0, 100, -100, 1000))
    if rng.random() < 0.2:
        return Request(
            id=f"{ns}-{name}",
            gpus=0,
            gpu_milli=rng.choice((250, 500)),
            namespace=ns,
            name=name,
            priority=priority,
        )
    return Request(
        id=f"{ns}-{name}", gpus=rng.choice((1, 2, 4, 4, 8)), namespace=ns, name=name, priority=priority
    )


def _stored(name: str, ns: str, placed: Placement, priority: int, started: float, app: str) -> dict:
    obj = pod(name, namespace=ns, placement=placed, key=KEY)
    obj["metadata"]["uid"] = f"uid-{ns}-{name}"
    obj["metadata"]["labels"] = {"app": app}
    obj["spec"]["priority"] = priority
    obj["status"]["startTime"] = _stamp(started)
    return obj


def _accounts(led: Ledger) -> list:
    """What the queue accounts hold, as values (the queue set and usage are objects, their repr an address):
    the declared queues, each queue's use per bucket and the pods waiting per leaf queue."""
    accounts = led.queue_accounts()
    if accounts is None:
        return []
    usage = {q: sorted(buckets.items()) for q, buckets in accounts.usage.by_queue.items()}
    return [sorted(accounts.declared), sorted(usage.items()), sorted(accounts.waiting.items())]


def ledger_digest(seed: int, steps: int = 300) -> str:
    rng = random.Random(seed)
    led = Ledger(LedgerConfig(placement_key=KEY, reservation_ttl_s=TTL, default_strategy="best_fit"))
    world = _World(led)
    now = T0 + 3600.0
    nodes = {}
    for i in range(rng.randint(2, 4)):
        n = node(
            f"n{i}",
            8,
            leaf=f"l{i % 2}",
            product=rng.choice(("NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3")),
        )
        nodes[n["metadata"]["name"]] = n
        world.apply(n, now)
    for obj in [
        gpu_queue("team-a", rng.choice((4, 8, 16))),
        gpu_queue("team-b", rng.choice((0, 4, 8))),
        gpu_queue(
            "team-c",
            rng.choice((0, 8)),
            **(
                {"preemption": {"criticalAcrossQueues": True, "minRunSeconds": 300}}
                if rng.random() < 0.5
                else {}
            ),
        ),
        namespace("ns-a", **{QUEUE_LABEL: "team-a"}),
        namespace("ns-b", **{QUEUE_LABEL: "team-b"}),
        namespace("ns-c", **{QUEUE_LABEL: "team-c"}),
    ]:
        world.apply(obj, now)
    out: list = []
    requests: dict[str, Request] = {}
    placed: dict[str, Placement] = {}  # reservation id -> placement, no pod stored yet
    stored: dict[str, dict] = {}  # reservation id -> its stored pod
    gated: dict[str, dict] = {}  # ticket id -> its gated pod
    for step in range(steps):
        op = rng.choice(
            ["admit"] * 6
            + ["gang", "store", "store", "store", "end", "explain", "refusal", "budget", "tick"]
            + ["pass", "pass", "plan", "record", "evict", "refuse", "release"]
        )
        serial = step + 1
        if op == "admit":
            req = _request(rng, serial)
            requests[req.id] = req
            result = led.reserve_or_wait(req, now, rng.random() < 0.85, rng.choice((0.0, 30.0, 600.0)))
            out.append(["admit", repr(result)])
            if isinstance(result, Placement):
                placed[req.id] = result
            elif isinstance(result, Waiting):
                g = gated_pod(req.name, result, KEY, namespace=req.namespace)
                g["metadata"]["uid"] = f"uid-{req.namespace}-{req.name}"
                g["spec"]["priority"] = req.priority
                if rng.random() < 0.2:
                    g["spec"]["preemptionPolicy"] = "Never"
                gated[req.id] = g
                world.apply(g, now)
        elif op == "gang":
            size = rng.randint(2, 4)
            gpus = rng.choice((2, 4, 8))
            key = f"gang-{serial}"
            spec = GroupSpec(key=key, size=size)
            ns = rng.choice(NAMESPACES)
            for i in range(size):
                req = Request(id=f"{key}-{i}", gpus=gpus, group=spec, namespace=ns, name=f"{key}-{i}")
                requests[req.id] = req
                result = led.reserve_or_wait(req, now, False)
                out.append(["gang", repr(result)])
                if isinstance(result, Placement):
                    placed[req.id] = result
        elif op == "store" and placed:
            rid = sorted(placed)[rng.randrange(len(placed))]
            p = placed.pop(rid)
            req = requests[rid]
            if rid in gated:
                obj = placed_pod(gated.pop(rid), p, KEY)
                obj["status"]["startTime"] = _stamp(now - rng.choice((0, 60, 4000)))
            else:
                started = now - rng.choice((0, 60, 600, 4000))
                obj = _stored(
                    req.name, req.namespace or "default", p, req.priority, started, rng.choice("xy")
                )
            stored[rid] = obj
            world.apply(obj, now)
        elif op == "end" and stored:
            rid = sorted(stored)[rng.randrange(len(stored))]
            obj = stored.pop(rid)
            world.delete(obj)
            out.append(["end", led.release(rid)])
        elif op == "explain":
            req = _request(rng, serial)
            explanation = led.explain(req, with_scores=False, now=now)
            out.append(["explain", repr(explanation.result), explanation.preemption])
        elif op == "refusal":
            req = _request(rng, serial)
            out.append(["refusal", led.quota_refusal(req), led.could_fit(req)])
        elif op == "budget":
            ns = rng.choice(NAMESPACES)
            world.apply(budget(ns, f"pdb-{rng.choice('xy')}", rng.randint(0, 2), app=rng.choice("xy")), now)
            out.append(["allowances", sorted(led.disruption_allowances().items())])
        elif op == "tick":
            now += rng.choice((1.0, 5.0, TTL + 1.0))
            expired = led.expire(now)
            for rid in expired:
                placed.pop(rid, None)
            out.append(["expire", expired])
        elif op == "pass":
            now += rng.choice((1.0, 6.0))
            for p in led.place_waiting(now, rng.choice((0.0, 600.0))):
                out.append(["placed", repr(p)])
                placed[p.placement.id] = p.placement
            plans = led.preemptions()
            out.append(["plans", [repr(plan) for plan in plans], [led.preemption_victims(p) for p in plans]])
        elif op == "plan":
            out.append(["planned", [repr(p) for p in led.plan_preemptions(now, rng.choice((1, 8)))]])
        elif op == "record":
            plans = [p for p in led.preemptions() if p.id in gated and not p.recorded]
            if plans:
                plan = plans[rng.randrange(len(plans))]
                g = copy.deepcopy(gated[plan.id])
                g["metadata"]["annotations"][PREEMPTING_ANNOTATION] = plan.record
                gated[plan.id] = g
                world.apply(g, now)
                out.append(["recorded", plan.id])
        elif op == "evict":
            victims = [v for p in led.preemptions() for v in led.preemption_victims(p)]
            if victims:
                ns, name = victims[rng.randrange(len(victims))][:2]
                for rid, obj in sorted(stored.items()):
                    if (obj["metadata"]["namespace"], obj["metadata"]["name"]) == (ns, name):
                        del stored[rid]
                        world.delete(obj)
                        out.append(["evicted", rid, led.release(rid)])
                        break
        elif op == "refuse":
            plans = led.preemptions()
            if plans:
                plan = plans[rng.randrange(len(plans))]
                victims = led.preemption_victims(plan)
                if victims:
                    led.eviction_refused(plan.id, victims[0][0], victims[0][1], now)
                    out.append(["refused", plan.id, [repr(p) for p in led.preemptions()]])
        elif op == "release" and placed:
            rid = sorted(placed)[rng.randrange(len(placed))]
            placed.pop(rid)
            out.append(["release", led.release(rid)])
        if step % 20 == 19:
            out.append(["line", [repr(e) for e in led.waiting_line()], led.waiting_by_priority()])
            out.append(["snapshot", led.snapshot(), _accounts(led)])
    for rid in sorted(placed):  # every placement gets its pod: the rebuild is then digested with the live one
        p = placed[rid]
        req = requests.get(rid)
        if rid in gated:
            obj = placed_pod(gated.pop(rid), p, KEY)
        elif req is not None:
            obj = _stored(req.name, req.namespace or "default", p, req.priority, now, "x")
        else:
            continue
        world.apply(obj, now)
    out.append(["live", led.snapshot(), [repr(e) for e in led.waiting_line()]])
    rebuilt = Ledger.rebuild(list(world.objects.values()), led.config, now)
    out.append(["rebuilt", rebuilt.snapshot(), [repr(e) for e in rebuilt.waiting_line()]])
    out.append(["rebuilt placed", [repr(p) for p in rebuilt.place_waiting(now + 1)]])
    out.append(["rebuilt held", [repr(p) for p in rebuilt.preemptions()]])
    return hashlib.sha256(json.dumps(out, sort_keys=True, default=repr).encode()).hexdigest()


def service_digest(seed: int, steps: int = 160) -> str:
    """The service's admissions (some dry runs, some retries carrying their prior id), the validating
    webhook's claims and lookups (some retried by the same claimer, some copies), confirms, releases, watch
    events and resyncs that replay the reservations whose pod is not stored yet."""
    rng = random.Random(seed)
    nodes = [node(f"n{i}", 8, leaf=f"l{i % 2}") for i in range(rng.randint(2, 4))]
    queues = [gpu_queue("team-a", 8), gpu_queue("team-b", 8), namespace("ns-a", **{QUEUE_LABEL: "team-a"})]
    objects: dict[str, dict] = {_World.key(o): o for o in [*nodes, *queues]}
    config = LedgerConfig(placement_key=KEY, reservation_ttl_s=TTL, default_strategy="best_fit")
    service = LedgerService(config, {"kind": "kubernetes"})
    now = 1000.0
    holder = "sync-1"
    service.sync_lease(holder, now, 600.0)
    out: list = [
        [
            "resync",
            {k: v for k, v in service.resync(list(objects.values()), now, holder).items() if k != "seconds"},
        ]
    ]
    issued: dict[str, tuple[Request, Placement]] = {}
    for step in range(steps):
        op = rng.choice(
            ["admit"] * 5
            + ["gang", "dry", "retry", "claim", "claim", "lookup", "store", "store"]
            + ["confirm", "release", "resync", "resync", "tick", "place", "status"]
        )
        serial = step + 1
        if op in ("admit", "dry"):
            ns = rng.choice(("ns-a", "ns-b"))
            req = Request(
                id=f"{ns}-p{serial}", gpus=rng.choice((1, 2, 4, 8)), namespace=ns, name=f"p{serial}"
            )
            (answer,) = service.admit([AdmitCall(req, op == "dry", None, rng.random() < 0.5)], now)
            out.append([op, repr(answer)])
            if isinstance(answer, Placement) and op == "admit":
                issued[req.id] = (req, answer)
        elif op == "gang":
            size = rng.randint(2, 3)
            spec = GroupSpec(key=f"g{serial}", size=size)
            calls = [
                AdmitCall(
                    Request(id=f"g{serial}-{i}", gpus=2, group=spec, namespace="ns-a", name=f"g{serial}-{i}")
                )
                for i in range(size)
            ]
            for call, answer in zip(calls, service.admit(calls, now), strict=True):
                out.append(["gang", repr(answer)])
                if isinstance(answer, Placement):
                    issued[call.request.id] = (call.request, answer)
        elif op == "retry" and issued:
            rid = sorted(issued)[rng.randrange(len(issued))]
            req = issued[rid][0]
            fresh = Request(id=f"{rid}-again{serial}", gpus=req.gpus, namespace=req.namespace, name=req.name)
            out.append(["retry", repr(service.admit([AdmitCall(fresh, False, rid)], now))])
        elif op == "claim" and issued:
            rid = sorted(issued)[rng.randrange(len(issued))]
            who = rng.choice(("", "uid-1", "uid-2"))
            out.append(["claim", repr(service.claim([(rid, who)] if who else [rid]))])
        elif op == "lookup":
            ids = [*sorted(issued)[:3], "unknown"]
            out.append(["lookup", repr(service.lookup(ids))])
        elif op == "store" and issued:
            rid = sorted(issued)[rng.randrange(len(issued))]
            req, p = issued.pop(rid)
            obj = pod(req.name, namespace=req.namespace or "default", placement=p, key=KEY)
            objects[_World.key(obj)] = obj
            out.append(["events", service.apply_events([("ADDED", obj)], now, holder)])
        elif op == "confirm" and issued:
            rid = sorted(issued)[rng.randrange(len(issued))]
            out.append(["confirm", service.confirm([rid], now)])
        elif op == "release" and issued:
            rid = sorted(issued)[rng.randrange(len(issued))]
            issued.pop(rid)
            out.append(["release", service.release([rid], now)])
        elif op == "resync":
            result = service.resync(list(objects.values()), now, holder)
            out.append(["resync", {k: v for k, v in result.items() if k != "seconds"}])
        elif op == "tick":
            now += rng.choice((1.0, TTL + 1.0))
            service.sync_lease(holder, now, 600.0)
            expired = service.ledger.expire(now)
            for rid in expired:
                issued.pop(rid, None)
            out.append(["expire", expired])
        elif op == "place":
            out.append(["placed", repr(service.place_waiting(now, holder))])
        elif op == "status":
            status = service.status()
            out.append(["status", status["pending"], status["waiting"], status["conflicts"]])
        out.append(["held", repr(service.lookup(sorted(issued)))])
        if step % 20 == 19:
            out.append(["snapshot", service.snapshot()])
    return hashlib.sha256(json.dumps(out, sort_keys=True, default=repr).encode()).hexdigest()


SEEDS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233)

# recorded before the admission rule and the preemption pass left gpuledger.core.ledger, and before the
# service read what its pending and claimed maps held from the ledger
LEDGER_RECORDED: dict[int, str] = {
    1: "243550f4ed7eb4d59ac0bd498d1dc73629f75320bbd660fc288e184eb82a612d",
    2: "929fa88a09f73cf3c1a16ee9a86de1c144a486237cbb8509414c9ffce3c14095",
    3: "6575c0f2afb439074f0841d2c7ad0425f40023771012d9637a9f140ec4b1c028",
    5: "2b3b48355b81e9f3237e9d8370cc2348139d83ab1d17f166a1ce1433f6de86e9",
    8: "fa6987ebb8ae4358262aebb22d37b608b24dff43d1d6bddc2f7ceb77dba2072a",
    13: "f99ce4ee9f0250e5d2614e902bb8f0a80d53ab583026bf906a1479a69b9dab06",
    21: "804c34cf06b001ce74392f4108cc60a71973d3d694ec065eae4c01fd07c830ba",
    34: "c6ce65ebf533fdd938a4f96f65afe4d3e2914c868039a87374468777245a607b",
    55: "0e7949447eb4df0fd34989944e6fef5e00c1eae3867cd0c3ddf2893f641a01c2",
    89: "c6e7348c46d0096a9e8676bd93a1a54718da40b22731da3aae4b582b19643028",
    144: "48acfc2f315dd323ff80fb513166eaafabb0bf175bf25de52fb4fceab669d459",
    233: "d6c8584c39ee8775c21cfa892ae533671a3e3949342e7d605a8c241b7fda6c30",
}
SERVICE_RECORDED: dict[int, str] = {
    1: "17ab7d1e7495f4198f70c78a6217c7ed9349bace6310ee673a5b70d90af8ea62",
    2: "ebac4cc036ff9925673d7ec2fb4b1a79810772c23d35fe50e6638af1f8cbeb68",
    3: "e6de13d28ae3483c57bd0e8ba93f7a002e0a272afd37fc1d89f63741643e02ff",
    5: "8a534fad321f386d78ab037994d296b243bf93d06775a234369ea0713cdfafab",
    8: "d6de90afd5fab0d3723b552a858baec2b8fc3c3ab82be4771dd5f6d678f69af6",
    13: "2cd7472c522895a4ed31b6a19b3767213b3a6f671835221d63146a484c7fb0e1",
    21: "10e60b593a0ac711a875ddf8a9df6166a747509a8704bf9f98d353642a2e0740",
    34: "24df15107d911335cdbba25e65811c654ee599c57beb8aee2ee734ccea216abe",
    55: "0aa71851de61ecb9523d98e9b2ccfc498f4a0833e7eeb51aaf709957de536b1c",
    89: "d747b2b9ce2952f89b603a30e2ff0827e31dcff67c552d50ce11871461ce287a",
    144: "e6052f448780a02454dd286a6985a818537bf3f19e400421dfc02e063402ea85",
    233: "debae3a0f61dd740a94916bddcc7c5c0388e332638c1e78885d54c19e928482c",
}


@pytest.mark.parametrize("seed", SEEDS)
def test_ledger_decisions_unchanged(seed: int) -> None:
    assert ledger_digest(seed) == LEDGER_RECORDED[seed]


@pytest.mark.parametrize("seed", SEEDS)
def test_service_answers_unchanged(seed: int) -> None:
    assert service_digest(seed) == SERVICE_RECORDED[seed]


if __name__ == "__main__":  # prints the digests to record
    for s in SEEDS:
        print(f"    {s}: {ledger_digest(s)!r},")
    for s in SEEDS:
        print(f"    {s}: {service_digest(s)!r},")
