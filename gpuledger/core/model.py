"""The allocator core's vocabulary: what a node offers, what a pod asks for, what the ledger answers.

Plain frozen dataclasses so that decisions can be compared, hashed, pickled across Ray and
rebuilt from the API server; nothing here knows about Kubernetes client objects, Ray or HTTP.
Kubernetes objects enter as plain dicts and are turned into these by `gpuledger.core.pods.objects`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gpuledger.core.slots_init import dict_init, slots_init

MILLI_PER_GPU = 1000


@slots_init
@dataclass(frozen=True, slots=True)  # no per-object __dict__: hundreds of thousands are kept
class Device:
    """One physical GPU on a node."""

    index: int
    uuid: str = ""
    product: str = ""
    memory_mib: int = 0
    healthy: bool = True
    utilization_pct: int | None = None  # NVML utilization the node agent published (None = not published)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty = every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class SelectorRequirement:
    """One `matchExpressions` entry of a required node affinity term."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceTruth:
    """What the node agent read from the kubelet (PodResources) and NVML: who holds each device
    (annotation agentaflow.gpu/device-holders). Sorted tuples, so equal annotations compare equal."""

    source: str = "unavailable"  # "podresources": `holders` is the kubelet's word; "unavailable": unknown
    holders: tuple[tuple[int, str, tuple[str, ...]], ...] = ()  # (device, "namespace/pod", containers)
    external: tuple[tuple[int, int, tuple[int, ...]], ...] = ()  # (device, MiB, pids) used outside pods
    unmapped: tuple[str, ...] = ()  # device ids the kubelet named that no probed device has

    @property
    def known(self) -> bool:
        """Whether `holders` is the kubelet's word (an empty list then means nothing is held)."""
        return self.source == "podresources"

    def devices_of(self, key: str) -> tuple[int, ...]:
        return tuple(d for d, k, _ in self.holders if k == key)

    def holder_of(self) -> dict[int, str]:
        return {d: k for d, k, _ in self.holders}


@dict_init  # one per Node object read: 65,000 in a large cluster's rebuild
@dataclass(frozen=True)
class NodeInfo:
    """What one node offers, as read from its Node object (and its device annotation)."""

    name: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[Device, ...]
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False
    spine: str = ""
    leaf: str = ""
    product: str = ""  # nvidia.com/gpu.product or accelerator label
    cheap: bool = False  # gpu-orchestrator/cheap-node
    gpu_schedulable: bool = True  # agentaflow.gpu/schedulable
    utilization_at: float | None = (
        None  # agentaflow.gpu/last-update, epoch seconds: when utilization was read
    )
    truth: DeviceTruth | None = None  # agentaflow.gpu/device-holders (None: not published)

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


class BindingMode(str, Enum):
    NODE_NAME = "nodeName"
    AFFINITY = "affinity"
    BOTH = "both"


@dataclass(frozen=True)
class GroupSpec:
    """A multi-pod workload placed all-or-nothing: a Job with parallelism, a StatefulSet, an explicit key."""

    key: str  # e.g. "job/ns/name" or "sts/ns/name" or the explicit group key
    size: int  # number of pods (nodes) in the group
    max_nodes_per_leaf: int = 0  # 0 = no limit
    max_gpus_per_leaf: int = 0  # 0 = no limit


@dataclass(frozen=True)
class PinnedDevices:
    """An explicit `gpu-scheduling-map` entry: this pod goes to that node on those devices."""

    node: str
    devices: tuple[int, ...]


@dict_init  # one per admission, prefetched placement and replayed pod: its generated __init__ is 6 us
@dataclass(frozen=True)
class Request:
    """What one pod asks of the ledger. `id` is the reservation key chosen by the caller."""

    id: str
    gpus: int = 0  # whole, exclusive GPUs
    gpu_milli: int = 0  # a share of one GPU (1..999) when gpus == 0 and exclusive access is off
    gpu_memory_mib: int = 0  # memory needed on each GPU (whole) or on the shared GPU
    cpu_milli: int = 0
    memory_mib: int = 0
    product: str | None = (
        None  # GPU product or accelerator the pod insists on (substring match, case-insensitive)
    )
    node_selector: tuple[tuple[str, str], ...] = ()
    # required node affinity: OR of terms, each an AND of requirements
    affinity_terms: tuple[tuple[SelectorRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    preferred_domain: str | None = None  # a leaf or spine name, or "leaf"/"spine" as a scope
    strategy: str | None = None  # None = the ledger's configured default
    priority: int = 0
    pinned: PinnedDevices | None = None
    group: GroupSpec | None = None
    latency_sensitive: bool = False
    network_bandwidth: str | None = None  # e.g. "high" | "medium" | "low"
    seed: int = 0
    namespace: str = ""
    name: str = ""  # pod name if known (may be empty at admission)
    network_bandwidth_gbps: float | None = (
        None  # a bandwidth annotation in Gbit/s ("100Gb", "400Gbps", "25G")
    )

    @property
    def is_shared(self) -> bool:
        return self.gpus == 0 and (self.gpu_milli > 0 or self.gpu_memory_mib > 0)

    @property
    def needs_gpu(self) -> bool:
        return self.gpus > 0 or self.is_shared

    def shape(self) -> tuple | None:
        """Every field but those that differ pod to pod (id, seed, name): pods of one shape get the same
        answer from a strategy in the same ledger state, so a placement made for one can serve the next
        (gpuledger.webhook.ledger.prefetch, gpuledger.sim.ahead). None for gangs and pinned pods, which are
        planned per pod.
        A plain tuple: hashing it is cheaper than a dataclass's generated __hash__ and __eq__."""
        if self.group is not None or self.pinned is not None:
            return None
        return tuple(v for k, v in vars(self).items() if k not in _PER_POD)


_PER_POD = frozenset({"id", "seed", "name"})


@slots_init
@dataclass(frozen=True, slots=True)  # no per-object __dict__: hundreds of thousands are kept
class DeviceShare:
    """A share of one device held by a non-exclusive placement."""

    device: int
    milli: int
    memory_mib: int = 0


@slots_init
@dataclass(frozen=True, slots=True)  # no per-object __dict__: hundreds of thousands are kept
class GroupSlot:
    """One pod's place in a group plan: slot number, node and exclusive devices."""

    slot: int
    node: str
    devices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    shares: tuple[DeviceShare, ...] = ()


@slots_init
@dataclass(frozen=True, slots=True)  # no per-object __dict__: hundreds of thousands are kept
class Placement:
    """A reservation's answer: where the pod goes and on which devices."""

    id: str
    node: str
    devices: tuple[int, ...] = ()  # exclusive devices (physical indices)
    shares: tuple[DeviceShare, ...] = ()  # shared devices
    uuids: tuple[str, ...] = ()  # uuids of devices + shares, in the same order
    cpu_milli: int = 0
    memory_mib: int = 0
    group: str | None = None
    slot: int | None = None
    strategy: str = ""
    score: float = 0.0
    tolerated_taints: tuple[Taint, ...] = ()  # taints on the node the webhook must tolerate for the pod
    # groups only: every slot of the group (so a rebuild restores unclaimed slots) and the time at which
    # slots no pod has claimed are released
    group_plan: tuple[GroupSlot, ...] = ()
    group_deadline: float | None = None
    # what admission tells the user beside the placement (a request the ledger could not check); not part of
    # the placement's identity: never signed into the annotation, left out of equality, absent after a rebuild
    warnings: tuple[str, ...] = field(default=(), compare=False)


class ReservationState(str, Enum):
    RESERVED = "reserved"
    CONFIRMED = "confirmed"


class Reason(str, Enum):
    """Why a node could not take a request; denials group candidates by these."""

    NOT_ENOUGH_GPUS = "not enough GPUs"
    NOT_ENOUGH_GPU_SHARE = "not enough GPU share (milli/memory)"
    NOT_ENOUGH_CPU = "not enough cpu"
    NOT_ENOUGH_MEMORY = "not enough memory"
    PRODUCT_MISMATCH = "GPU product mismatch"
    GPU_MEMORY_TOO_SMALL = "GPU memory too small"
    TAINT = "untolerated taint"
    SELECTOR = "nodeSelector/affinity mismatch"
    UNHEALTHY_DEVICE = "unhealthy device"
    NOT_READY = "node not ready or cordoned"
    NOT_GPU_SCHEDULABLE = "node marked not GPU-schedulable"
    LEAF_CONSTRAINT = "leaf/spine constraint"
    DOMAIN = "outside preferred domain"
    PINNED = "explicit map mismatch"
    PRIORITY_HEADROOM = "capacity kept as headroom for higher priority"
    UNKNOWN_NODE = "unknown node"
    NETWORK_BANDWIDTH = (
        "network bandwidth below topology.scheduler/network-bandwidth "
        "(node label topology.scheduler/network-bandwidth-gbps missing or lower)"
    )
    SHARED_GPUS = "GPUs shared with other pods (topology.scheduler/latency-sensitive)"
    EXTERNAL_GPU_USE = "GPU memory used by processes outside Kubernetes"


@dataclass(frozen=True)
class NearMiss:
    node: str
    reasons: tuple[Reason, ...]
    free_gpus: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Denial:
    """Why a request could not be placed, grouped by reason, with the closest candidates."""

    id: str
    message: str
    by_reason: tuple[tuple[Reason, int], ...] = ()  # reason -> number of nodes rejected for it
    near_misses: tuple[NearMiss, ...] = ()
    strategy: str = ""


@dataclass(frozen=True)
class NodeScore:
    node: str
    score: float | None  # None = infeasible
    reasons: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class Explanation:
    """`explain`: the decision the ledger would make, with per-node scores, reserving nothing."""

    result: Placement | Denial
    scores: tuple[NodeScore, ...] = field(default_factory=tuple)
    # with GPU queues, for a request that would wait: its queue's quota refusal, and the preemption plan it
    # could make (victims and the rule allowing each) or why it has none; "" otherwise
    preemption: str = ""
