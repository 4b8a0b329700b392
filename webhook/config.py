"""The webhook's settings: one dataclass, loadable from a YAML file, every field documented in docs/webhook.md."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from allocator.service import LedgerConfig
from allocator.service import BindingMode

VISIBILITY_MODES = ("host-indices", "runtime-uuids", "device-plugin")
AFFINITY_KEYS = ("kubernetes.io/hostname", "metadata.name")


@dataclass
class WebhookConfig:
    # how the chosen node is written on the pod: nodeName | affinity | both
    binding_mode: BindingMode = BindingMode.AFFINITY
    # affinity on the hostname label (value = node name) or an exact matchFields on metadata.name
    affinity_key: str = "kubernetes.io/hostname"
    # how the pod learns its devices: host-indices | runtime-uuids | device-plugin
    visibility_mode: str = "runtime-uuids"
    # ledger slow/down: deny (False, default) or allow the pod unplaced (True)
    fail_open: bool = False
    # internal deadline for one admission, kept below the webhook's timeoutSeconds
    deadline_s: float = 2.0
    # ledger settings, used when this process creates the ledger (the first replica wins)
    default_strategy: str = "best_fit"
    reservation_ttl_s: float = 30.0
    # HMAC key for the placement annotation: a file (a mounted Secret) or the literal (tests/dev only)
    hmac_key_file: str | None = None
    hmac_key: str = ""
    # requests from these users may change gpuledger.io/* annotations and labels on UPDATE
    privileged_usernames: tuple[str, ...] = (
        "system:serviceaccount:gpuledger-system:gpuledger",
    )
    gpu_resource: str = "nvidia.com/gpu"
    max_body_bytes: int = 4 * 1024 * 1024
    # how long an owner Job/StatefulSet fetched from the API is reused
    owner_cache_ttl_s: float = 5.0
    # /readyz asks the ledger at most this often
    ready_cache_s: float = 1.0
    # the earlier tools' schedulers: a pod naming one gets schedulerName default-scheduler and a GPU placement
    takeover_scheduler_names: tuple[str, ...] = ("gpu-scheduler", "topology-aware-scheduler")

    def __post_init__(self) -> None:
        self.binding_mode = BindingMode(self.binding_mode)
        if self.visibility_mode not in VISIBILITY_MODES:
            raise ValueError(f"visibility_mode={self.visibility_mode!r}: expected one of {', '.join(VISIBILITY_MODES)}")
        if self.affinity_key not in AFFINITY_KEYS:
            raise ValueError(f"affinity_key={self.affinity_key!r}: expected one of {', '.join(AFFINITY_KEYS)}")
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s={self.deadline_s!r}: expected a positive number of seconds")
        self.privileged_usernames = tuple(self.privileged_usernames)

    def placement_key(self) -> bytes:
        """The HMAC key: the file's bytes (trailing newline dropped) or the literal."""
        if self.hmac_key_file:
            return Path(self.hmac_key_file).read_bytes().rstrip(b"\r\n")
        return self.hmac_key.encode()

    def ledger_config(self) -> LedgerConfig:
        """The ledger's settings (used where this process creates the ledger: the first replica wins)."""
        return LedgerConfig(default_strategy=self.default_strategy, reservation_ttl_s=self.reservation_ttl_s,
                            placement_key=self.placement_key())

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> "WebhookConfig":
        known = {f.name for f in fields(cls)}
        # accept camelCase as written in Kubernetes-style YAML
        norm = {_snake(k): v for k, v in (data or {}).items()}
        unknown = sorted(set(norm) - known)
        if unknown:
            raise ValueError(f"unknown webhook config keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**norm)

    @classmethod
    def from_file(cls, path: str | Path) -> "WebhookConfig":
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a YAML mapping of webhook settings")
        return cls.from_mapping(data)


def _snake(key: str) -> str:
    out = []
    for ch in str(key).replace("-", "_"):
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def field_names() -> list[str]:
    return [f.name for f in fields(WebhookConfig)]

