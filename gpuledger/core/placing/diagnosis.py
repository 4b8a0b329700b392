"""Denials: why no node takes a request, counted per reason over every node with the closest near misses, kept
current per request shape by re-classifying only the nodes touched since (O(changes), not O(nodes)); a shape
that reads no labels is counted by node class (gpuledger.core.placing.node_classes), so a new one costs
O(classes). A diagnosis only explains: it never chooses a node and never changes what is held.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter, OrderedDict

from gpuledger.core.books.books import Books
from gpuledger.core.model import Denial, NearMiss, Reason, Request
from gpuledger.core.nodes.node_state import NodeState
from gpuledger.core.nodes.published_gpus import PublishedGpus, PublishedSlices
from gpuledger.core.placing.filters import Filters, dynamic, static_signature, unplaceable_reason
from gpuledger.core.placing.node_classes import ClassDiagnosis, NodeClasses
from gpuledger.core.plugins.plugin import ScoreContext, Strategy
from gpuledger.names import (
    GPU_COUNT,
    GPU_MEMORY,
    GPU_MILLI,
    GPU_PRODUCT,
    GPU_RESOURCE,
    HOLDERS_ANNOTATION,
    PREFERRED_DOMAIN,
    PRIORITY,
    SCHEDULING_MAP,
)

_DEFAULT_CHOICE = Strategy()  # classifies for strategies whose device choice refuses as the default's does
DIAGNOSIS_LIMIT = 16  # request shapes whose denial diagnosis is kept current
NEAR_MISSES = 3
NAMED = 3  # a reason that covers at most this many nodes names them (the one node NotReady, say)


class Counts(Counter):
    """Nodes per reason; `names` holds the node names of each reason that covers at most NAMED nodes."""

    names: dict[Reason, tuple[str, ...]]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.names = {}


# the annotation or pod field that asked for what a reason says no node has (a denial names it)
ASKED_BY: dict[Reason, str] = {
    Reason.NOT_ENOUGH_GPUS: f"the GPU count: container resources nvidia.com/gpu or annotation {GPU_COUNT}",
    Reason.NOT_ENOUGH_GPU_SHARE: f"annotation {GPU_MILLI} / {GPU_MEMORY}",
    Reason.NOT_ENOUGH_CPU: "container resources cpu",
    Reason.NOT_ENOUGH_MEMORY: "container resources memory",
    Reason.PRODUCT_MISMATCH: f"annotation {GPU_PRODUCT}",
    Reason.GPU_MEMORY_TOO_SMALL: f"annotation {GPU_MEMORY}",
    Reason.TAINT: "spec.tolerations",
    Reason.SELECTOR: "spec.nodeSelector / spec.affinity / spec.nodeName",
    Reason.LEAF_CONSTRAINT: "the gang's size and GPU count",
    Reason.DOMAIN: f"annotation {PREFERRED_DOMAIN}",
    Reason.PINNED: f"annotation {SCHEDULING_MAP}",
    Reason.PRIORITY_HEADROOM: f"annotation {PRIORITY} or spec.priority",
}


class _Diagnosis:
    """Every node's denial classification for one request shape: counts per reason, the nodes that fit, and
    the near-miss keys in order; `seq` is the position in `ClusterIndex.touched` it is current up to."""

    __slots__ = ("_keys", "counts", "first", "fitting", "misses", "named", "near", "seq")

    def __init__(self) -> None:
        self.seq = 0
        self.first: dict[str, Reason | None] = {}  # node -> reason counted (None = fits)
        self.counts: dict[Reason, int] = {}
        self.fitting = 0
        self.near: list[tuple] = []  # sorted near-miss keys (closest first), the node name last
        self.misses: dict[str, NearMiss] = {}  # near misses built so far, valid until their node is touched
        self._keys: dict[str, tuple] = {}  # node -> its key in `near`
        self.named: dict[Reason, set[str]] = {}  # reason -> nodes counted under it

    def reason_of(self, name: str) -> Reason | None:
        return self.first[name]

    def names(self, reason: Reason, limit: int, exclude) -> list[str] | None:
        group = self.named.get(reason, ())
        if len(group) > limit + len(exclude):
            return None
        out = sorted(n for n in group if n not in exclude)
        return out if len(out) <= limit else None

    def nearest(self, count: int, exclude) -> list[str]:
        out: list[str] = []
        for key in self.near:
            if len(out) == count:
                break
            if key[-1] not in exclude:
                out.append(key[-1])
        return out

    def add(self, name: str, reason: Reason | None, key: tuple | None, bulk: bool = False) -> None:
        """Count a node in; `bulk` appends its key unsorted (the caller sorts `near` once at the end)."""
        self.first[name] = reason
        if reason is None:
            self.fitting += 1
        else:
            self.counts[reason] = self.counts.get(reason, 0) + 1
        if reason is not None:
            self.named.setdefault(reason, set()).add(name)
        if key is not None:
            key = (*key, name)
            self._keys[name] = key
            if bulk:
                self.near.append(key)
            else:
                insort(self.near, key)

    def drop(self, name: str) -> None:
        if name not in self.first:
            return
        reason = self.first.pop(name)
        if reason is None:
            self.fitting -= 1
        else:
            left = self.counts[reason] - 1
            if left:
                self.counts[reason] = left
            else:
                del self.counts[reason]
            group = self.named[reason]
            group.discard(name)
            if not group:
                del self.named[reason]
        self.misses.pop(name, None)
        key = self._keys.pop(name, None)
        if key is not None:
            del self.near[bisect_left(self.near, key)]


class Diagnoser:
    """Per-reason counts and near misses for a request no node takes, and the denial that says so."""

    def __init__(self, books: Books, filters: Filters, published: PublishedSlices | None = None):
        self.books = books
        self.filters = filters
        self.published = published if published is not None else PublishedSlices()
        self.diagnoses: OrderedDict[tuple, _Diagnosis | ClassDiagnosis] = OrderedDict()  # shape -> it, LRU
        self.classes = NodeClasses(books.index)

    def classify(
        self, node: NodeState, req: Request, strategy: Strategy, ctx: ScoreContext
    ) -> tuple[Reason | None, tuple | None]:
        """(the reason a denial counts the node under, or None when it fits; its near-miss sort key without
        the name, or None)."""
        if not node.placeable:
            return unplaceable_reason(node), None
        reason, _ = self.filters.static(node, req)
        if reason is not None:
            return reason, None
        _, reasons = dynamic(node, req, strategy, ctx)
        if not reasons:
            return None, None
        return reasons[0], (-node.whole_free, -max_share(node), -node.cpu_free, -node.mem_free)

    def near_miss(self, node: NodeState, req: Request, strategy: Strategy, ctx: ScoreContext) -> NearMiss:
        _, reasons = dynamic(node, req, strategy, ctx)
        detail = (
            f"has {node.whole_free} free GPU(s), largest free share {max_share(node)}m, "
            f"{node.cpu_free}m cpu and {node.mem_free} MiB memory free"
        ) + truth_detail(node, self.books.config.external_memory_threshold_mib)
        return NearMiss(node.name, tuple(reasons), node.whole_free, detail)

    def diagnose_full(self, req: Request, strategy: Strategy, ctx: ScoreContext, exclude=frozenset()):
        """(per-reason node counts, the closest near misses, nodes that fit), by classifying every node.
        The reference `diagnose` must equal; also the path for strategies with their own device choice."""
        counts = Counts()
        misses: list[tuple] = []
        fitting = 0
        named: dict[Reason, list[str]] = {}
        for node in self.books.index.nodes.values():
            if node.name in exclude:
                reason: Reason | None = Reason.LEAF_CONSTRAINT
                key = None
            else:
                reason, key = self.classify(node, req, strategy, ctx)
            if reason is None:
                fitting += 1
                continue
            counts[reason] += 1
            if counts[reason] <= NAMED:
                named.setdefault(reason, []).append(node.name)
            if key is not None:
                misses.append((*key, node.name))
        misses.sort()
        counts.names = {r: tuple(sorted(names)) for r, names in named.items() if counts[r] <= NAMED}
        nodes = self.books.index.nodes
        near = tuple(self.near_miss(nodes[key[-1]], req, strategy, ctx) for key in misses[:NEAR_MISSES])
        return counts, near, fitting

    def diagnose(self, req: Request, strategy: Strategy, ctx: ScoreContext, exclude=frozenset()):
        """What `diagnose_full` answers, from a per-request-shape diagnosis that re-classifies only the nodes
        touched since it was last read (a flood of pods that cannot fit costs O(changes), not O(nodes))."""
        if getattr(type(strategy), "choose_devices", None) is not Strategy.choose_devices:
            if not getattr(strategy, "refuses_as_default", False):
                return self.diagnose_full(req, strategy, ctx, exclude)  # its choice may read the cluster
            strategy = _DEFAULT_CHOICE  # it refuses a node exactly when the default device choice does
        diag = self.diagnosis(req, strategy, ctx)
        nodes = self.books.index.nodes
        counts = Counts(diag.counts)
        fitting = diag.fitting
        excluded = [name for name in exclude if name in nodes]
        for name in excluded:
            reason = diag.reason_of(name)
            if reason is None:
                fitting -= 1
                continue
            left = counts[reason] - 1
            if left:
                counts[reason] = left
            else:
                del counts[reason]
        if excluded:
            counts[Reason.LEAF_CONSTRAINT] += len(excluded)
        for reason, n in counts.items():
            if n <= NAMED:
                if reason == Reason.LEAF_CONSTRAINT and excluded:
                    if n == len(excluded):
                        counts.names[reason] = tuple(sorted(excluded))
                    continue
                names = diag.names(reason, NAMED, exclude)
                if names is not None:
                    counts.names[reason] = tuple(names)
        near: list[NearMiss] = []
        for name in diag.nearest(NEAR_MISSES, exclude):
            miss = diag.misses.get(name)
            if miss is None:
                miss = diag.misses[name] = self.near_miss(nodes[name], req, strategy, ctx)
            near.append(miss)
        return counts, tuple(near), fitting

    def diagnosis(self, req: Request, strategy: Strategy, ctx: ScoreContext) -> _Diagnosis | ClassDiagnosis:
        shape = (static_signature(req), req.gpus, req.gpu_milli, req.cpu_milli, req.memory_mib)
        if not (req.node_selector or req.affinity_terms or req.network_bandwidth_gbps is not None):
            return self.class_diagnosis(shape, req, strategy, ctx)  # labels do not matter: count by class
        index = self.books.index
        log, base = index.touched, index.touched_base
        diag = self.diagnoses.get(shape)
        if not isinstance(diag, _Diagnosis) or diag.seq < base:
            diag = _Diagnosis()
            for node in index.nodes.values():
                diag.add(node.name, *self.classify(node, req, strategy, ctx), bulk=True)
            diag.near.sort()
            self.diagnoses[shape] = diag
            if len(self.diagnoses) > DIAGNOSIS_LIMIT:
                self.diagnoses.popitem(last=False)
        else:
            self.diagnoses.move_to_end(shape)
            nodes = index.nodes
            for name in set(log[diag.seq - base :]):
                diag.drop(name)
                state = nodes.get(name)
                if state is not None:
                    diag.add(name, *self.classify(state, req, strategy, ctx))
        diag.seq = base + len(log)
        return diag

    def class_diagnosis(self, shape: tuple, req: Request, strategy: Strategy, ctx: ScoreContext):
        """The shape's diagnosis by node class: a new shape costs one classification per class."""
        classes = self.classes
        classes.refresh()
        diag = self.diagnoses.get(shape)
        if isinstance(diag, ClassDiagnosis) and diag.current():
            self.diagnoses.move_to_end(shape)
            return diag
        diag = self.diagnoses[shape] = ClassDiagnosis(
            classes, lambda node: self.classify(node, req, strategy, ctx)
        )
        if len(self.diagnoses) > DIAGNOSIS_LIMIT:
            self.diagnoses.popitem(last=False)
        return diag

    def denial(
        self, req, strategy_name, counts: Counter, near: tuple[NearMiss, ...], prefix: str = ""
    ) -> Denial:
        by_reason = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].value)))
        parts = []
        for reason, n in by_reason:
            text = f"{n} node(s) {reason.value}"
            names = getattr(counts, "names", {}).get(reason, ())
            if names and len(names) == n:
                text += f" ({', '.join(names)})"
            best = next((m for m in near if m.reasons and m.reasons[0] == reason), None)
            if best is not None:
                if reason == Reason.NOT_ENOUGH_GPUS:
                    text += f" (best: {best.node} has {best.free_gpus} free)"
                else:
                    text += f" (best: {best.node} {best.detail})"
            elif reason == Reason.EXTERNAL_GPU_USE:  # not among the closest: name one such node
                node = next((n for n in self.books.index.nodes.values() if n.external), None)
                if node is not None:
                    threshold = self.books.config.external_memory_threshold_mib
                    text += f" (e.g. {node.name}{truth_detail(node, threshold)})"
            if reason in ASKED_BY:
                text += f" [asked by {ASKED_BY[reason]}]"
            parts.append(text)
        if not self.books.index.nodes:
            parts.append("the ledger knows no nodes")
        if req.gpus > 0 or req.is_shared:
            parts.extend(dra_words(self.dra_nodes()))
        message = prefix or f"no node fits {describe(req)} with strategy {strategy_name}"
        return Denial(
            id=req.id,
            message=f"{message}: {', '.join(parts)}" if parts else message,
            by_reason=by_reason,
            near_misses=near,
            strategy=strategy_name,
        )

    def dra_nodes(self) -> list[PublishedGpus]:
        """The known nodes whose GPUs a DRA driver publishes in ResourceSlices and that have none gpuledger
        places (no nvidia.com/gpu in status.allocatable, no devices in the node agent's annotation)."""
        if not self.published:
            return []
        nodes = self.books.index.nodes
        return [
            gpus
            for name, gpus in self.published.by_node().items()
            if name in nodes and not nodes[name].info.devices
        ]


def dra_words(nodes: list[PublishedGpus]) -> list[str]:
    """What a denial says of the nodes whose GPUs are published through DRA: which, by which driver, and
    what the user can do (gpuledger places device-plugin GPUs only, until its DRA mode)."""
    if not nodes:
        return []
    drivers = sorted({d for n in nodes for d in n.drivers})
    named = "; ".join(f"{n.node}: {n.describe()}" for n in nodes[:NAMED])
    more = f"; and {len(nodes) - NAMED} more" if len(nodes) > NAMED else ""
    return [
        f"{len(nodes)} node(s) have GPUs published through DRA ({named}{more}), not as {GPU_RESOURCE} in "
        f"status.allocatable: gpuledger places device-plugin GPUs ({GPU_RESOURCE}) until its DRA mode; "
        f"to use these, ask for the GPUs with a ResourceClaim (spec.resourceClaims, a DeviceClass of driver "
        f"{', '.join(drivers)}) instead of {GPU_RESOURCE} and gpuledger's GPU annotations: gpuledger then "
        f"leaves the pod to kube-scheduler and the DRA driver"
    ]


def describe(req: Request) -> str:
    """What a request asks for, in the words of a denial."""
    if req.gpus > 0:
        what = f"{req.gpus} whole GPU(s)"
        if req.gpu_memory_mib:
            what += f" with {req.gpu_memory_mib} MiB each (annotation {GPU_MEMORY})"
    elif req.is_shared:
        parts = []
        if req.gpu_milli:
            parts.append(f"{req.gpu_milli} milli-GPU (annotation {GPU_MILLI})")
        if req.gpu_memory_mib:
            parts.append(f"{req.gpu_memory_mib} MiB GPU memory (annotation {GPU_MEMORY})")
        what = "a share of " + " and ".join(parts)
    else:
        what = "a pod without GPUs"
    if req.cpu_milli or req.memory_mib:
        what += f" (+{req.cpu_milli}m cpu, {req.memory_mib} MiB memory)"
    if req.product:
        what += f" of product {req.product!r} (annotation {GPU_PRODUCT})"
    return what


def truth_detail(node: NodeState, threshold_mib: int) -> str:
    """What the node's agent says that keeps devices from being placed on (annotation
    agentaflow.gpu/device-holders): GPU memory used outside Kubernetes, pods the kubelet lists."""
    truth = node.info.truth
    if truth is None:
        return ""
    parts = []
    for d, mib, pids in truth.external:
        if d in node.external:
            parts.append(
                f"device {d} has {mib} MiB GPU memory used by processes outside Kubernetes"
                f"{' (pids ' + ', '.join(map(str, pids[:5])) + ')' if pids else ''}, at or above "
                f"external_memory_threshold_mib {threshold_mib}"
            )
    if truth.known and truth.holders:
        held = ", ".join(f"{d} by {key}" for d, key, _ in truth.holders[:8])
        parts.append(f"the kubelet says device(s) {held} are held")
    if not parts:
        return ""
    return f"; {'; '.join(parts)} (annotation {HOLDERS_ANNOTATION})"


def max_share(node: NodeState) -> int:
    """The largest free milli-GPU on a device without an exclusive holder."""
    owner, free = node.dev_owner, node.dev_free_milli
    return max((free[p] for p in range(len(owner)) if owner[p] is None), default=0)
