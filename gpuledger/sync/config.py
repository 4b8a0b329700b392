"""What the cluster sync is tuned by (`SyncConfig`) and what it counts (`SyncStats`), with the names it
watches by.

Plain values only: nothing here talks to the API or the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuledger.names import (
    GPUQUEUE_KIND,
    HOSTNAME_LABEL,
    QUEUE_API_VERSION,
    RESERVATION_ID_KEY,
    RESOURCE_API_VERSION,
    RESOURCE_SLICE_KIND,
)

if TYPE_CHECKING:
    from gpuledger.sync.evictor import EvictorStats

NODE, POD = "Node", "Pod"
NAMESPACE, PDB, QUEUE = "Namespace", "PodDisruptionBudget", GPUQUEUE_KIND
SLICE = (
    RESOURCE_SLICE_KIND  # the GPUs a DRA driver publishes for a node (gpuledger.core.nodes.published_gpus)
)
# what the sync lists and watches, in the order a full list hands them to the ledger: what a pod is judged by
# (its node and the node's DRA slices, its namespace's queue, the budgets over it) before the pods
KINDS = (NODE, SLICE, NAMESPACE, QUEUE, PDB, POD)
API_VERSIONS = {
    NODE: "v1",
    POD: "v1",
    NAMESPACE: "v1",
    PDB: "policy/v1",
    QUEUE: QUEUE_API_VERSION,
    SLICE: RESOURCE_API_VERSION,
}


@dataclass
class SyncConfig:
    batch_max: int = 500  # events per ledger call
    batch_linger_s: float = 0.02  # after the first event, how long to gather more into the same call
    watch_timeout_s: int = 240  # server-side watch timeout; the watch resumes from its last resourceVersion
    list_page_size: int = 500
    expiry_interval_s: float = 5.0
    status_interval_s: float = 2.0  # how often to ask whether the ledger restarted empty
    retry_backoff_s: tuple[float, float] = (0.2, 5.0)  # first and largest wait after a failure
    watch_retries: int = 5  # consecutive failures of one watch before a full resync
    reservation_label: str = RESERVATION_ID_KEY
    # the ledger's sync lease (gpuledger.service.sync_writer): one replica's sync writes at a time; the
    # others take
    # over within a term of its going silent, at once when it stops
    lease_term_s: float = 30.0
    lease_renew_s: float = 10.0  # how often the holder renews, and a standby asks
    # the node label (or metadata.name) the placement adapter names a waiting pod's node by
    # (gpuledger.sync.placer), as the webhook's binding does
    affinity_key: str = HOSTNAME_LABEL
    # while the GPUQueue CRD is not installed, how often its list is tried again (queues: none meanwhile)
    absent_retry_s: float = 30.0
    # how often the leading sync writes each GPUQueue's status from the ledger (gpuledger.sync.queue_status)
    queue_status_interval_s: float = 10.0


@dataclass
class SyncStats:
    events_applied: int = 0
    batches: int = 0
    resyncs: int = 0
    gone: int = 0  # 410s: the watch fell out of the API server's window
    watch_errors: int = 0
    target_errors: int = 0
    expiry_confirmed: int = 0
    expiry_released: int = 0
    conflicts: int = 0  # placement conflicts that appeared (a pod holding a placement it does not own)
    conflict_events: int = 0  # Events posted on such pods
    last_error: str = ""
    leading: bool = False  # whether this sync holds the ledger's sync lease (it writes; the others stand by)
    lease_taken: int = 0  # terms this sync began (each starts with a full list)
    lease_lost: int = 0  # terms that ended without this sync handing the lease back (another took it)
    fenced: int = 0  # writes the ledger refused because this sync no longer held the lease
    lease_errors: int = 0  # lease calls that failed (the ledger restarting)
    events_dropped: int = 0  # events seen while standing by (the holder's own watch forwards them)
    resync_reasons: list[str] = field(default_factory=list)
    evictions: EvictorStats | None = None  # the eviction adapter's counters (gpuledger.sync.evictor)
