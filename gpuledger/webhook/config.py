"""The webhook's settings: one dataclass, loadable from a YAML file, every field documented in
docs/webhook.md.

The file is gpuledger's own mapping or, as written, the topology scheduler's `SchedulerConfig` (alone or
inside a ConfigMap dump). Loading only reads and validates: pushing settings to the ledger is
gpuledger.webhook.config_watch's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from gpuledger.core.ledger import LedgerConfig
from gpuledger.core.model import BindingMode
from gpuledger.names import (
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    LEAF_LABEL,
    SCHEDULER_CONFIG_API_GROUP,
    SPINE_LABEL,
    SYSTEM_NAMESPACE,
    WHEN_FULL_REFUSE,
    WHEN_FULL_WAIT,
)
from gpuledger.ray.channel import CHANNEL_MODES
from gpuledger.service.settings import (
    DEFAULT_SCORING_WEIGHTS,
    LedgerSettings,
    check_external_threshold,
    check_label_key,
    check_leaf_limit,
    check_scoring_weights,
    check_strategy,
)
from gpuledger.service.sync_writer import check_term
from gpuledger.sync.config import SyncConfig
from gpuledger.webhook.ledger.prefetch import PrefetchSettings

VISIBILITY_MODES = ("host-indices", "runtime-uuids", "device-plugin")
AFFINITY_KEYS = (HOSTNAME_LABEL, "metadata.name")
# the AgentaFlow scheduler's variable: overrides the file's default_strategy at start (and at each reload)
STRATEGY_ENV = "SCHEDULING_STRATEGY"
# the topology scheduler's SchedulerConfig, accepted as its doc writes it
SCHEDULER_CONFIG_KINDS = ("SchedulerConfig", "TopologySchedulerConfig")
# keys pushed to the live ledger (at start and on each reload); every other key takes effect at a restart
LIVE_KEYS = (
    "default_strategy",
    "scoring_weights",
    "topology_constraints",
    "leaf_label",
    "spine_label",
    "external_memory_threshold_mib",
)
TOPOLOGY_CONSTRAINTS = {"max_nodes_per_leaf": "maxNodesPerLeaf", "max_gpus_per_leaf": "maxGPUsPerLeaf"}


@dataclass
class WebhookConfig:
    # how the chosen node is written on the pod: nodeName | affinity | both
    binding_mode: BindingMode = BindingMode.AFFINITY
    # affinity on the hostname label (value = node name) or an exact matchFields on metadata.name
    affinity_key: str = HOSTNAME_LABEL
    # how the pod learns its devices: host-indices | runtime-uuids | device-plugin
    visibility_mode: str = "runtime-uuids"
    # ledger slow/down: deny (False, default) or allow the pod unplaced (True)
    fail_open: bool = False
    # a GPU pod that could fit the cluster but not now: admitted gated to wait in the ledger's line (wait,
    # the default) or denied at once (refuse); a pod's or its workload's topology.scheduler/when-full wins
    when_full: str = WHEN_FULL_WAIT
    # internal deadline for one admission, kept below the webhook's timeoutSeconds
    deadline_s: float = 2.0
    # how admissions reach the ledger actor: a direct channel, on 127.0.0.1 from the actor's own Ray node
    # and on its node IP from others (auto), on 127.0.0.1 only (loopback), on the node IP always (node-ip),
    # or Ray calls only (off)
    ledger_channel: str = "auto"
    # live ledger settings: pushed to the ledger at start and when the file changes
    # (gpuledger.webhook.config_watch)
    default_strategy: str = "fgd_host"
    # the `balanced` strategy's weights (the topology scheduler's scoringWeights); a weight left out counts 0
    scoring_weights: dict = field(default_factory=lambda: dict(DEFAULT_SCORING_WEIGHTS))
    # per-leaf limits for a gang (Job/StatefulSet placed all-or-nothing): max_nodes_per_leaf,
    # max_gpus_per_leaf
    topology_constraints: dict = field(default_factory=lambda: dict.fromkeys(TOPOLOGY_CONSTRAINTS, 0))
    # the Node labels naming a node's leaf and spine (live too, but a change rebuilds the ledger)
    leaf_label: str = LEAF_LABEL
    spine_label: str = SPINE_LABEL
    # a GPU whose memory processes outside Kubernetes use at or above this many MiB (the node agent's
    # agentaflow.gpu/device-holders) is not placed on; 0 = never (live)
    external_memory_threshold_mib: int = LedgerConfig.external_memory_threshold_mib
    # used when this process creates the ledger (the first replica wins)
    reservation_ttl_s: float = 30.0
    # placements admitted ahead per pod shape, so the next pod of a shape skips the ledger round trip
    # (gpuledger.webhook.ledger.prefetch); 0 = off. One not taken within prefetch_max_age_s is released
    prefetch_depth: int = 0
    prefetch_max_age_s: float = 1.0
    # HMAC key for the placement annotation: a file (a mounted Secret) or the literal (tests/dev only)
    hmac_key_file: str | None = None
    hmac_key: str = ""
    # requests from these users may change gpuledger.io/* annotations and labels on UPDATE
    privileged_usernames: tuple[str, ...] = (f"system:serviceaccount:{SYSTEM_NAMESPACE}:gpuledger",)
    gpu_resource: str = GPU_RESOURCE
    max_body_bytes: int = 4 * 1024 * 1024
    # how long an owner Job/StatefulSet fetched from the API is reused
    owner_cache_ttl_s: float = 5.0
    # the ledger's sync lease (gpuledger.service.sync_writer): how long a replica's cluster sync holds the
    # right to
    # write the ledger without renewing it (renewed every third of it), so how long a crashed replica's
    # sync keeps the ledger from following the cluster before another takes over
    sync_lease_term_s: float = 30.0
    # /readyz asks the ledger at most this often
    ready_cache_s: float = 1.0
    # the earlier tools' schedulers: a pod naming one gets schedulerName default-scheduler and a GPU placement
    takeover_scheduler_names: tuple[str, ...] = ("gpu-scheduler", "topology-aware-scheduler")

    def __post_init__(self) -> None:
        self.binding_mode = BindingMode(self.binding_mode)
        if self.visibility_mode not in VISIBILITY_MODES:
            raise ValueError(
                f"visibility_mode={self.visibility_mode!r}: expected one of {', '.join(VISIBILITY_MODES)}"
            )
        if self.affinity_key not in AFFINITY_KEYS:
            raise ValueError(
                f"affinity_key={self.affinity_key!r}: expected one of {', '.join(AFFINITY_KEYS)}"
            )
        if self.ledger_channel not in CHANNEL_MODES:
            raise ValueError(
                f"ledger_channel={self.ledger_channel!r}: expected one of {', '.join(CHANNEL_MODES)}"
            )
        if self.when_full not in (WHEN_FULL_WAIT, WHEN_FULL_REFUSE):
            raise ValueError(
                f"when_full={self.when_full!r}: expected {WHEN_FULL_WAIT} (a pod that does not fit now waits "
                f"gated, in line) or {WHEN_FULL_REFUSE} (denied at once)"
            )
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s={self.deadline_s!r}: expected a positive number of seconds")
        self.sync_lease_term_s = check_term(self.sync_lease_term_s, "sync_lease_term_s")
        self.privileged_usernames = tuple(self.privileged_usernames)
        self.default_strategy = check_strategy(self.default_strategy, "default_strategy")
        self.scoring_weights = check_scoring_weights(self.scoring_weights, "scoring_weights")
        self.topology_constraints = _topology_constraints(self.topology_constraints)
        for key in ("leaf_label", "spine_label"):
            check_label_key(getattr(self, key), key)
        check_external_threshold(self.external_memory_threshold_mib)
        self.prefetch_settings()  # (raises naming the setting)
        self.ledger_settings()  # what only the combination can get wrong (leaf_label == spine_label)

    def with_environment(self, environ: Mapping[str, str]) -> WebhookConfig:
        """This config with SCHEDULING_STRATEGY (when set and not empty) as the default strategy."""
        name = (environ.get(STRATEGY_ENV) or "").strip()
        if not name:
            return self
        return WebhookConfig(**{**self.__dict__, "default_strategy": check_strategy(name, STRATEGY_ENV)})

    def sync_config(self) -> SyncConfig:
        """The cluster sync's tuning this config sets (its lease; the rest are the sync's defaults)."""
        return SyncConfig(
            lease_term_s=self.sync_lease_term_s,
            lease_renew_s=self.sync_lease_term_s / 3,
            affinity_key=self.affinity_key,
        )

    def prefetch_settings(self) -> PrefetchSettings:
        return PrefetchSettings(depth=self.prefetch_depth, max_age_s=self.prefetch_max_age_s)

    def placement_key(self) -> bytes:
        """The HMAC key: the file's bytes (trailing newline dropped) or the literal."""
        if self.hmac_key_file:
            return Path(self.hmac_key_file).read_bytes().rstrip(b"\r\n")
        return self.hmac_key.encode()

    def ledger_config(self) -> LedgerConfig:
        """The ledger's settings (used where this process creates the ledger: the first replica wins)."""
        return LedgerConfig(
            default_strategy=self.default_strategy,
            reservation_ttl_s=self.reservation_ttl_s,
            placement_key=self.placement_key(),
            balanced_weights=dict(self.scoring_weights),
            leaf_label=self.leaf_label,
            spine_label=self.spine_label,
            external_memory_threshold_mib=self.external_memory_threshold_mib,
        )

    def ledger_settings(self) -> LedgerSettings:
        """The settings a live ledger takes (at start and on every reload)."""
        return LedgerSettings(
            default_strategy=self.default_strategy,
            scoring_weights=dict(self.scoring_weights),
            leaf_label=self.leaf_label,
            spine_label=self.spine_label,
            external_memory_threshold_mib=self.external_memory_threshold_mib,
            **self.topology_constraints,
        )

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> WebhookConfig:
        # snake_case, camelCase (as Kubernetes-style YAML writes it) and kebab-case name the same key
        known = {_norm(f.name): f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        unknown = []
        for key, value in (data or {}).items():
            name = known.get(_norm(key))
            if name is None:
                unknown.append(str(key))
            elif name in values:
                raise ValueError(
                    f"{key}={value!r} is not accepted: {name} is already set (by another spelling)"
                )
            else:
                values[name] = value
        if unknown:
            raise ValueError(
                f"unknown webhook config keys: {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known.values()))})"
            )
        return cls(**values)

    @classmethod
    def from_document(cls, data: Any, where: str = "config") -> WebhookConfig:
        """gpuledger's mapping, a topology scheduler `SchedulerConfig` (its `spec`), or a ConfigMap holding
        either under one data key."""
        if not isinstance(data, dict):
            raise ValueError(
                f"{where}: expected a YAML mapping of webhook settings, a {SCHEDULER_CONFIG_KINDS[0]} "
                f"or a ConfigMap holding one"
            )
        kind, api = data.get("kind"), str(data.get("apiVersion") or "")
        if kind == "ConfigMap" and api == "v1":
            key, text = _config_map_entry(data, where)
            return cls.from_document(yaml.safe_load(text) or {}, f"{where} data[{key}]")
        if kind in SCHEDULER_CONFIG_KINDS or api.split("/")[0] == SCHEDULER_CONFIG_API_GROUP:
            if kind not in SCHEDULER_CONFIG_KINDS:
                raise ValueError(
                    f"{where}: kind={kind!r} is not accepted: expected one of "
                    f"{', '.join(SCHEDULER_CONFIG_KINDS)} for apiVersion {api}"
                )
            spec = data.get("spec") or {}
            if not isinstance(spec, dict):
                raise ValueError(
                    f"{where}: spec={spec!r} is not accepted: expected a mapping (scoringWeights, "
                    f"topologyConstraints, or any gpuledger key)"
                )
            return cls.from_mapping(spec)
        return cls.from_mapping(data)

    @classmethod
    def from_file(cls, path: str | Path) -> WebhookConfig:
        return cls.from_document(yaml.safe_load(Path(path).read_text()) or {}, str(path))


def _norm(key: Any) -> str:
    return str(key).replace("_", "").replace("-", "").lower()


def _topology_constraints(value: Any) -> dict[str, int]:
    """{max_nodes_per_leaf, max_gpus_per_leaf} from either spelling; a limit left out is 0 (none)."""
    accepted = ", ".join(TOPOLOGY_CONSTRAINTS.values())
    if not isinstance(value, Mapping):
        raise ValueError(
            f"topology_constraints={value!r} is not accepted: expected a mapping of {accepted} "
            "to integers (0 = no limit)"
        )
    names = {_norm(k): k for k in TOPOLOGY_CONSTRAINTS}
    out = dict.fromkeys(TOPOLOGY_CONSTRAINTS, 0)
    for key, limit in value.items():
        name = names.get(_norm(key))
        if name is None:
            raise ValueError(
                f"topology_constraints.{key}={limit!r} is not accepted: expected one of {accepted}"
            )
        out[name] = check_leaf_limit(limit, f"topology_constraints.{key}")
    return out


def _config_map_entry(config_map: dict, where: str) -> tuple[str, str]:
    """The one data entry holding the settings: `config.yaml` when there are several."""
    data = config_map.get("data") or {}
    if not isinstance(data, dict) or not data:
        raise ValueError(
            f"{where}: ConfigMap data={data!r} is not accepted: expected one entry holding the "
            "settings (YAML)"
        )
    if len(data) > 1:
        if "config.yaml" not in data:
            raise ValueError(
                f"{where}: ConfigMap data keys {', '.join(sorted(map(str, data)))} are not accepted: "
                "expected one entry, or several with one named config.yaml"
            )
        return "config.yaml", str(data["config.yaml"])
    ((key, text),) = data.items()
    return str(key), str(text)


def field_names() -> list[str]:
    return [f.name for f in fields(WebhookConfig)]
