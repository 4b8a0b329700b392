"""GPU queues: who owns which share of the cluster, as written in GPUQueue objects.

A queue has a GPU quota per GPU product (or `any`), a limit on what it may borrow above it, a limit on what of
its unused quota others may borrow, a fair-share weight, an optional parent (a two-level tree: organisation ->
team) and the namespaces that belong to it (a label selector). `QueueSet` is the validated whole: every parent
exists and is a top-level queue, workloads run only in leaf queues, at most one default queue takes the
namespaces no selector names (an implicit one with no quota when none is marked).

The object is a GPUQueue of the API group gpuledger.io (v1alpha1), cluster-scoped (its CRD is built by
gpuledger.controller.crds). gpuledger's own group rather than agentaflow.io: agentaflow.io and gpu.warp.dev
are served so that the earlier tools' manifests keep working, and hold only kinds those tools had; neither had
a queue, and a kind added there would read as theirs. v1alpha1 because its fields may still change.

Pure: the GPUQueue object enters as the plain dict the API server stores, and every refusal names the field,
the value and what is accepted (`QueueError`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.model import SelectorRequirement
from gpuledger.core.placing.filters import requirement_matches
from gpuledger.core.pods.annotation_values import AnnotationError

ANY_PRODUCT = "any"  # a quota entry for GPUs of every product the queue does not name
IMPLICIT_DEFAULT = "default"  # the queue of unselected namespaces when no GPUQueue is marked default
MAX_GPUS = 10_000_000
MAX_WEIGHT = 1_000_000.0
MAX_MIN_RUN_SECONDS = 31_536_000
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)


class QueueError(AnnotationError):
    """A GPUQueue (or a set of them) gpuledger cannot honour; `str()` names the field, value and fix."""


@dataclass(frozen=True)
class ProductQuota:
    """GPUs of one product (the node's nvidia.com/gpu.product, any case) or of `any` other product."""

    product: str
    gpus: int
    borrowing_limit: int | None = None  # GPUs it may use above `gpus` (None: as many as others do not use)
    lending_limit: int | None = None  # GPUs of its unused quota others may borrow (None: all of it)

    @property
    def kept(self) -> int:
        """GPUs of the quota never lent: while unused they stay free for the queue."""
        return 0 if self.lending_limit is None else self.gpus - self.lending_limit


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes label selector (matchLabels AND matchExpressions); an empty one selects everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        plain = dict(labels)
        return all(plain.get(k) == v for k, v in self.match_labels) and all(
            requirement_matches(req, plain) for req in self.match_expressions
        )


@dataclass(frozen=True)
class PreemptionRules:
    """What a queue's waiting workloads may take back, and how long its running ones are safe."""

    reclaim: bool = True  # take back GPUs it lent from queues above their quota
    within_queue: bool = True  # preempt lower-priority workloads of the same queue
    critical_across_queues: bool = False  # `critical` work may preempt lower priority in other queues
    min_run_s: float = 0.0  # a workload of this queue running for less is never a victim


@dataclass(frozen=True)
class GPUQueue:
    name: str
    quotas: tuple[ProductQuota, ...] = ()
    weight: float = 1.0
    parent: str | None = None
    namespace_selector: LabelSelector | None = None  # None: selects no namespace
    default: bool = False
    preemption: PreemptionRules = field(default_factory=PreemptionRules)
    # product -> bucket, filled as asked (a plan asks for every running workload's products)
    _buckets: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def bucket(self, product: str) -> str:
        """The quota entry a GPU of `product` counts against: its product's, else `any`, else (no entry: a
        quota of 0, all its use borrowed) the product itself."""
        known = self._buckets.get(product)
        if known is not None:
            return known
        wanted = product.lower()
        found = next((q.product for q in self.quotas if q.product.lower() == wanted), None)
        if found is None:
            found = ANY_PRODUCT if any(q.product == ANY_PRODUCT for q in self.quotas) else product
        self._buckets[product] = found
        return found

    def quota(self, bucket: str) -> ProductQuota:
        """The entry named `bucket` (as `bucket` returns it); 0 GPUs where the queue names none."""
        for q in self.quotas:
            if q.product == bucket:
                return q
        return ProductQuota(bucket, 0)

    def covers(self, bucket: str, product: str) -> bool:
        """Whether GPUs of `product` count against `bucket` in this queue."""
        return self.bucket(product) == bucket

    @property
    def total_gpus(self) -> int:
        return sum(q.gpus for q in self.quotas)


class QueueSet:
    """Every GPUQueue, validated as a whole: names, the two-level tree, the default queue."""

    def __init__(self, queues: Iterable[GPUQueue]):
        self.queues: dict[str, GPUQueue] = {}
        for q in queues:
            if q.name in self.queues:
                raise QueueError(f"GPUQueue {q.name}: metadata.name", q.name, "a name no other GPUQueue has")
            self.queues[q.name] = q
        self.children: dict[str, tuple[str, ...]] = {}
        for q in sorted(self.queues.values(), key=lambda q: q.name):
            if q.parent is None:
                continue
            parent = self.queues.get(q.parent)
            where = f"GPUQueue {q.name}: spec.parent"
            if parent is None:
                raise QueueError(where, q.parent, f"the name of an existing GPUQueue ({self._names()})")
            if parent.parent is not None:
                raise QueueError(
                    where,
                    q.parent,
                    f"a top-level GPUQueue (queues are two levels deep; {parent.name} has a parent)",
                )
            self.children[parent.name] = (*self.children.get(parent.name, ()), q.name)
        for name in self.children:
            q = self.queues[name]
            if q.namespace_selector is not None:
                raise QueueError(
                    f"GPUQueue {name}: spec.namespaceSelector",
                    "set",
                    "no selector on a queue with child queues (workloads run in the leaf queues)",
                )
            if q.default:
                raise QueueError(
                    f"GPUQueue {name}: spec.default", "true", "false on a queue with child queues"
                )
        marked = sorted(q.name for q in self.queues.values() if q.default)
        if len(marked) > 1:
            raise QueueError(
                f"GPUQueue {marked[1]}: spec.default",
                "true",
                f"false: {marked[0]} is already the default queue",
            )
        if marked:
            self.default = marked[0]
        else:
            self.default = IMPLICIT_DEFAULT
            if IMPLICIT_DEFAULT in self.queues:  # a queue named "default" but not marked: it is the default
                self.queues[IMPLICIT_DEFAULT] = _replace_default(self.queues[IMPLICIT_DEFAULT])
                if IMPLICIT_DEFAULT in self.children:
                    raise QueueError(
                        f"GPUQueue {IMPLICIT_DEFAULT}: spec.parent of its children",
                        IMPLICIT_DEFAULT,
                        "a default queue with no child queues: mark another leaf queue spec.default: true",
                    )
            else:
                self.queues[IMPLICIT_DEFAULT] = GPUQueue(IMPLICIT_DEFAULT, default=True)

    def _names(self) -> str:
        return ", ".join(sorted(self.queues)) or "none exist"

    def __contains__(self, name: object) -> bool:
        return name in self.queues

    def __getitem__(self, name: str) -> GPUQueue:
        return self.queues[name]

    def leaves(self) -> list[str]:
        return sorted(n for n in self.queues if n not in self.children)

    def top_level(self) -> list[str]:
        return sorted(n for n, q in self.queues.items() if q.parent is None)

    def path(self, name: str) -> tuple[str, ...]:
        """The queue and its parent, bottom up."""
        q = self.queues[name]
        return (name,) if q.parent is None else (name, q.parent)

    def top(self, name: str) -> str:
        return self.path(name)[-1]

    def siblings_level(self, a: str, b: str) -> tuple[str, str]:
        """The ancestors of `a` and `b` (themselves included) just below their lowest common ancestor: the
        two queues whose quotas decide whether one may take GPUs back from the other."""
        pa, pb = self.path(a), self.path(b)
        if len(pa) == 2 and len(pb) == 2 and pa[1] == pb[1]:
            return pa[0], pb[0]
        return pa[-1], pb[-1]

    def queue_of(self, namespace: str, labels: Mapping[str, str]) -> str:
        """The leaf queue a namespace's workloads belong to: the one whose selector matches its labels, else
        the default queue. A namespace two queues select is refused, naming both."""
        matched = [
            q.name
            for q in sorted(self.queues.values(), key=lambda q: q.name)
            if q.namespace_selector is not None and q.namespace_selector.matches(labels)
        ]
        if len(matched) > 1:
            raise QueueError(
                f"namespace {namespace}: metadata.labels",
                dict(labels),
                f"labels that exactly one GPUQueue's spec.namespaceSelector selects (these select it: "
                f"{', '.join(matched)})",
            )
        return matched[0] if matched else self.default


def _replace_default(q: GPUQueue) -> GPUQueue:
    return GPUQueue(q.name, q.quotas, q.weight, q.parent, q.namespace_selector, True, q.preemption)


# --- parsing the GPUQueue object ------------------------------------------------------------------------


def queue_from_object(obj: Mapping[str, Any]) -> GPUQueue:
    """A GPUQueue from the object the API server stores (metadata.name, spec). Refuses, naming the field,
    anything it cannot honour, also what the CRD's schema would have refused (objects may come from files)."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise QueueError(
            "GPUQueue metadata.name", name, "a DNS subdomain name (lower case, digits, '-', '.')"
        )
    spec = obj.get("spec", {})
    where = f"GPUQueue {name}: spec"
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise QueueError(where, spec, "an object")
    known = {"quotas", "weight", "parent", "namespaceSelector", "default", "preemption"}
    for key in spec:
        if key not in known:
            raise QueueError(f"{where}.{key}", spec[key], f"one of the fields {', '.join(sorted(known))}")
    quotas = _quotas(where, spec.get("quotas"))
    weight = _number(f"{where}.weight", spec.get("weight", 1), 0.0, MAX_WEIGHT)
    if weight <= 0:
        raise QueueError(
            f"{where}.weight", spec.get("weight"), f"a number above 0 and at most {MAX_WEIGHT:g}"
        )
    parent = spec.get("parent")
    if parent is not None and (not isinstance(parent, str) or not _NAME.fullmatch(parent) or parent == name):
        raise QueueError(f"{where}.parent", parent, "the name of another GPUQueue")
    selector = spec.get("namespaceSelector")
    return GPUQueue(
        name=name,
        quotas=quotas,
        weight=weight,
        parent=parent,
        namespace_selector=None if selector is None else _selector(f"{where}.namespaceSelector", selector),
        default=_bool(f"{where}.default", spec.get("default", False)),
        preemption=_preemption(f"{where}.preemption", spec.get("preemption")),
    )


def queue_set_from_objects(objects: Iterable[Mapping[str, Any]]) -> QueueSet:
    return QueueSet(queue_from_object(o) for o in objects)


def _int(where: str, raw: Any, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise QueueError(where, raw, f"an integer from {lo} to {hi}")
    return raw


def _number(where: str, raw: Any, lo: float, hi: float) -> float:
    if (
        isinstance(raw, bool)
        or not isinstance(raw, (int, float))
        or not math.isfinite(raw)
        or not lo <= raw <= hi
    ):
        raise QueueError(where, raw, f"a number from {lo:g} to {hi:g}")
    return float(raw)


def _bool(where: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise QueueError(where, raw, "true or false")
    return raw


def _quotas(where: str, raw: Any) -> tuple[ProductQuota, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise QueueError(f"{where}.quotas", raw, "a list of {product, gpus, borrowingLimit, lendingLimit}")
    out: list[ProductQuota] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw):
        at = f"{where}.quotas[{i}]"
        if not isinstance(entry, Mapping):
            raise QueueError(at, entry, "an object with product and gpus")
        for key in entry:
            if key not in ("product", "gpus", "borrowingLimit", "lendingLimit"):
                raise QueueError(
                    f"{at}.{key}", entry[key], "one of product, gpus, borrowingLimit, lendingLimit"
                )
        product = entry.get("product", ANY_PRODUCT)
        if not isinstance(product, str) or not product.strip() or len(product) > 253:
            raise QueueError(f"{at}.product", product, f"a GPU product as nodes label it, or {ANY_PRODUCT!r}")
        product = product.strip()
        if product.lower() == ANY_PRODUCT:
            product = ANY_PRODUCT
        if product.lower() in seen:
            raise QueueError(
                f"{at}.product",
                product,
                f"a product no other entry names (quotas[{seen[product.lower()]}] does)",
            )
        seen[product.lower()] = i
        if "gpus" not in entry:
            raise QueueError(f"{at}.gpus", None, f"an integer from 0 to {MAX_GPUS}")
        gpus = _int(f"{at}.gpus", entry["gpus"], 0, MAX_GPUS)
        borrowing = entry.get("borrowingLimit")
        lending = entry.get("lendingLimit")
        if borrowing is not None:
            borrowing = _int(f"{at}.borrowingLimit", borrowing, 0, MAX_GPUS)
        if lending is not None and (
            isinstance(lending, bool) or not isinstance(lending, int) or not 0 <= lending <= gpus
        ):
            raise QueueError(f"{at}.lendingLimit", lending, f"an integer from 0 to the quota's gpus ({gpus})")
        out.append(ProductQuota(product, gpus, borrowing, lending))
    return tuple(out)


def label_selector(where: str, raw: Any) -> LabelSelector:
    """A Kubernetes label selector (a GPUQueue's namespaceSelector, a PodDisruptionBudget's selector);
    refuses, naming `where`, what is not one."""
    return _selector(where, raw)


def _selector(where: str, raw: Any) -> LabelSelector:
    if not isinstance(raw, Mapping):
        raise QueueError(where, raw, "a label selector: {matchLabels: {...}, matchExpressions: [...]}")
    for key in raw:
        if key not in ("matchLabels", "matchExpressions"):
            raise QueueError(f"{where}.{key}", raw[key], "matchLabels or matchExpressions")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise QueueError(f"{where}.matchLabels", labels, "a map of label names to string values")
    exprs = raw.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise QueueError(f"{where}.matchExpressions", exprs, "a list of {key, operator, values}")
    reqs = []
    for i, e in enumerate(exprs):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(e, Mapping) or not isinstance(e.get("key"), str) or not e["key"]:
            raise QueueError(at, e, "an object with a key, an operator and (for In, NotIn) values")
        op = e.get("operator")
        if op not in SELECTOR_OPERATORS:
            raise QueueError(f"{at}.operator", op, " | ".join(SELECTOR_OPERATORS))
        values = e.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise QueueError(f"{at}.values", values, "a list of strings")
        if op in ("In", "NotIn") and not values:
            raise QueueError(f"{at}.values", values, f"at least one value for {op}")
        if op in ("Exists", "DoesNotExist") and values:
            raise QueueError(f"{at}.values", values, f"no values for {op}")
        reqs.append(SelectorRequirement(e["key"], op, tuple(values)))
    return LabelSelector(tuple(sorted(labels.items())), tuple(reqs))


def _preemption(where: str, raw: Any) -> PreemptionRules:
    if raw is None:
        return PreemptionRules()
    if not isinstance(raw, Mapping):
        raise QueueError(where, raw, "an object: {reclaim, withinQueue, criticalAcrossQueues, minRunSeconds}")
    for key in raw:
        if key not in ("reclaim", "withinQueue", "criticalAcrossQueues", "minRunSeconds"):
            raise QueueError(
                f"{where}.{key}", raw[key], "one of reclaim, withinQueue, criticalAcrossQueues, minRunSeconds"
            )
    return PreemptionRules(
        reclaim=_bool(f"{where}.reclaim", raw.get("reclaim", True)),
        within_queue=_bool(f"{where}.withinQueue", raw.get("withinQueue", True)),
        critical_across_queues=_bool(f"{where}.criticalAcrossQueues", raw.get("criticalAcrossQueues", False)),
        min_run_s=float(_int(f"{where}.minRunSeconds", raw.get("minRunSeconds", 0), 0, MAX_MIN_RUN_SECONDS)),
    )
