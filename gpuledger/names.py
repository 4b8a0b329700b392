"""Every name gpuledger reads or writes on Kubernetes objects, defined once.

Annotation and label keys, API groups and versions, resource names: the wire vocabulary that the core, the
webhook, the controller, the node agent, the sync and the CLI must spell alike. Plain strings, standard
library only and no import of gpuledger, so every layer (the pure core included) may import it.
"""

from __future__ import annotations

# --- annotation families ---------------------------------------------------------------------------------
# the earlier tools' families (docs/annotations.md): users write these on pods and workloads, and a
# workload's keys in them are handed down to its pods
TOPOLOGY_PREFIX = "topology.scheduler/"
AGENTAFLOW_GPU_PREFIX = "agentaflow.gpu/"
USER_ANNOTATION_PREFIXES = (TOPOLOGY_PREFIX, AGENTAFLOW_GPU_PREFIX)
# gpuledger's own: only the webhook writes gpuledger.io/* on a pod, and strips a user's
LEDGER_PREFIX = "gpuledger.io/"

# --- annotation keys users write on pods and workloads ---------------------------------------------------
GPU_COUNT = "topology.scheduler/gpu-count"
PREFERRED_DOMAIN = "topology.scheduler/preferred-domain"
PLACEMENT_STRATEGY = "topology.scheduler/placement-strategy"
LATENCY_SENSITIVE = "topology.scheduler/latency-sensitive"
NETWORK_BANDWIDTH = "topology.scheduler/network-bandwidth"
SCHEDULING_MAP = "gpu-scheduling-map"
SCHEDULING_MAP_ALIAS = "topology.scheduler/gpu-scheduling-map"
# a group (Job, StatefulSet, Kubeflow job) is placed all-or-nothing only when asked; this asks (or, "false",
# declines). In the topology.scheduler/ family, not gpuledger.io/: those keys only the webhook may write.
GANG = "topology.scheduler/gang"
SCHEDULING_STRATEGY = "agentaflow.gpu/scheduling-strategy"
PRIORITY = "agentaflow.gpu/priority"
GPU_MEMORY = "agentaflow.gpu/memory"
EXCLUSIVE_ACCESS = "agentaflow.gpu/exclusive-access"
GPU_MILLI = "agentaflow.gpu/milli"
GPU_PRODUCT = "agentaflow.gpu/product"

# --- keys only gpuledger writes on pods and namespaces ---------------------------------------------------
PLACEMENT_ANNOTATION = "gpuledger.io/placement"  # the signed placement, on the pod
RESERVATION_ID_KEY = "gpuledger.io/reservation-id"  # the label naming the pod's reservation
# the namespace label that opts a namespace in to admission (value ADMISSION_ENABLED)
ADMISSION_LABEL = "gpuledger.io/admission"
ADMISSION_ENABLED = "enabled"
# the controller's, on the Jobs it makes for a GPUWorkload and on their pods (not gpuledger.io/*: the webhook
# strips those)
WORKLOAD_NAME_LABEL = "gpuworkload.agentaflow.io/name"
WORKLOAD_UID_LABEL = "gpuworkload.agentaflow.io/uid"
WORKLOAD_GROUP_LABEL = "gpuworkload.agentaflow.io/group"
WORKLOAD_ATTEMPT_ANNOTATION = "gpuworkload.agentaflow.io/attempt"
EVENTS_REPORTING_COMPONENT = "gpuledger.io/webhook"  # events.k8s.io/v1 reportingComponent

# --- node labels and annotations the node agent writes (and the ledger, the controller and the CLI read) --
GPU_ENABLED_LABEL = "agentaflow.gpu/enabled"
SCHEDULABLE_LABEL = "agentaflow.gpu/schedulable"
GPU_COUNT_LABEL = "agentaflow.gpu/count"
UTILIZATION_TIER_LABEL = "agentaflow.gpu/utilization-tier"
DEVICES_ANNOTATION = "agentaflow.gpu/devices"
NODE_STATUS_ANNOTATION = "agentaflow.gpu/status"
LAST_UPDATE_ANNOTATION = "agentaflow.gpu/last-update"  # when the node agent last read the devices
HOLDERS_ANNOTATION = "agentaflow.gpu/device-holders"  # who holds each device, by the kubelet
XIDS_ANNOTATION = "agentaflow.gpu/xid-errors"

# --- node labels read ------------------------------------------------------------------------------------
LEAF_LABEL = "topology.scheduler/leaf"  # the defaults; the webhook's config may name others
SPINE_LABEL = "topology.scheduler/spine"
# a node's network bandwidth in Gbit/s ("200"; "400Gbps" is read too)
NETWORK_BANDWIDTH_LABEL = "topology.scheduler/network-bandwidth-gbps"
AGENT_NETWORK_BANDWIDTH_LABEL = "agentaflow.gpu/network-bandwidth-gbps"  # the node agent's, from sysfs
PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA's GPU feature discovery
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
ACCELERATOR_LABEL = "accelerator"
CHEAP_LABEL = "gpu-orchestrator/cheap-node"

# --- Kubernetes' own labels gpuledger reads and writes --------------------------------------------------
HOSTNAME_LABEL = "kubernetes.io/hostname"  # node affinity on it names the chosen node
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # a StatefulSet pod's ordinal
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # an Indexed Job pod's index

# --- resource names --------------------------------------------------------------------------------------
GPU_RESOURCE = "nvidia.com/gpu"  # the extended resource, and the GPU taint's key

# --- gpuledger's own objects ----------------------------------------------------------------------------
SYSTEM_NAMESPACE = "gpuledger-system"  # where the manifests install the webhook and the controller
# the webhook configurations, and the webhook each holds
MUTATING_CONFIG, VALIDATING_CONFIG = "gpuledger-mutating", "gpuledger-validating"
MUTATING_WEBHOOK, VALIDATING_WEBHOOK = "mutate.gpuledger.io", "validate.gpuledger.io"

# --- API groups and versions -----------------------------------------------------------------------------
AGENTAFLOW_GROUP, AGENTAFLOW_VERSION = "agentaflow.io", "v1"  # GPUWorkload and GPUNode
WARP_GROUP, WARP_VERSION = "gpu.warp.dev", "v1alpha1"  # GPUWorkload
AGENTAFLOW_API_VERSION = f"{AGENTAFLOW_GROUP}/{AGENTAFLOW_VERSION}"
WARP_API_VERSION = f"{WARP_GROUP}/{WARP_VERSION}"
GPUWORKLOAD_PLURAL, GPUNODE_PLURAL = "gpuworkloads", "gpunodes"
# GPUQueue: gpuledger's own API (no earlier tool had queues), so in gpuledger's group (docs/queues.md)
QUEUE_GROUP, QUEUE_VERSION = "gpuledger.io", "v1alpha1"
QUEUE_API_VERSION = f"{QUEUE_GROUP}/{QUEUE_VERSION}"
GPUQUEUE_KIND, GPUQUEUE_PLURAL = "GPUQueue", "gpuqueues"
# the topology scheduler's SchedulerConfig, accepted as a webhook config file
SCHEDULER_CONFIG_API_GROUP = "topology.scheduler"
# Dynamic Resource Allocation (GA in 1.34): the ResourceSlices in which a DRA driver publishes devices
RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"
RESOURCE_API_VERSION = f"{RESOURCE_GROUP}/{RESOURCE_VERSION}"
RESOURCE_SLICE_KIND, RESOURCE_SLICE_PLURAL = "ResourceSlice", "resourceslices"
# the DRA drivers whose devices are GPUs: NVIDIA's (kubernetes-sigs/dra-driver-nvidia-gpu)
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
GPU_DRA_DRIVERS = (NVIDIA_GPU_DRIVER,)

# --- waiting pods (docs/queues.md) -----------------------------------------------------------------------
# the scheduling gate a GPU pod that does not fit now is admitted with; removed once the ledger has placed it
SCHEDULING_GATE = "gpuledger.io/placement"
# on a waiting pod: its request, its arrival stamped by the ledger and where it was issued, signed
WAITING_ANNOTATION = "gpuledger.io/waiting"
# written with the placement of a pod that waited; its containers' device variables read them through the
# downward API when they start: NVIDIA_VISIBLE_DEVICES (runtime-uuids) and CUDA_VISIBLE_DEVICES (host-indices)
VISIBLE_DEVICES_ANNOTATION = "gpuledger.io/visible-devices"
DEVICE_INDICES_ANNOTATION = "gpuledger.io/device-indices"
# --- queues and preemption (docs/queues.md) ----------------------------------------------------------------
# on a namespace: the GPUQueue it belongs to, by name (wins over every queue's namespaceSelector)
QUEUE_LABEL = "gpuledger.io/queue"
# on a waiting pod that takes GPUs back: the plan it waits on (JSON: its ticket id, the victims, the nodes
# kept for it), written before any victim is evicted, so a ledger rebuilt after a crash keeps the promise
PREEMPTING_ANNOTATION = "gpuledger.io/preempting"
# the Event reasons: on the victim's owner (or the pod, when it has none), and on the preemptor
PREEMPTED_REASON, PREEMPTING_REASON = "Preempted", "Preempting"
# what a pod that does not fit now asks for: "wait" or "refuse" (denied at once); an annotation on the pod or
# its workload, else the webhook's `when_full` (wait by default)
WHEN_FULL = "topology.scheduler/when-full"
WHEN_FULL_WAIT, WHEN_FULL_REFUSE = "wait", "refuse"
# the gang key of a Kubernetes PodGroup's pods: "podgroup/<namespace>/<name>". Its pods beyond `minCount` are
# placed one by one near the gang once it is placed, as kube-scheduler schedules them
# (gpuledger.core.placing.gangs)
PODGROUP_GANG_PREFIX = "podgroup/"
