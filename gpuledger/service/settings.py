"""The ledger settings an operator may change while it runs, and their validation: the default strategy, the
`balanced` strategy's scoring weights, the per-leaf limits of gangs, the topology label keys. Pure: every bad
value is a ValueError naming the key, the value and what is accepted; nothing here touches a ledger.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies check_strategy accepts)
from gpuledger.core.ledger import LedgerConfig
from gpuledger.core.plugins.plugin import DEFAULT_BALANCED_WEIGHTS
from gpuledger.core.plugins.registry import canonical_name, strategy_names

__all__ = [
    "DEFAULT_SCORING_WEIGHTS",
    "LedgerSettings",
    "check_external_threshold",
    "check_label_key",
    "check_leaf_limit",
    "check_scoring_weights",
    "check_strategy",
    "strategy_names",
]

# the `balanced` strategy's weights, named as the topology scheduler's SchedulerConfig `scoringWeights`
DEFAULT_SCORING_WEIGHTS: Mapping[str, float] = dict(DEFAULT_BALANCED_WEIGHTS)
MAX_LEAF_LIMIT = 100_000
MAX_EXTERNAL_MIB = 1 << 30
# a Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of up to 63 characters
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _norm(key: Any) -> str:
    return str(key).replace("_", "").replace("-", "").lower()


def check_strategy(name: Any, key: str = "default_strategy") -> str:
    """The registered name of strategy `name`; ValueError naming `key`, the value and the accepted names."""
    try:
        if not isinstance(name, str):
            raise ValueError(name)
        return canonical_name(name)
    except ValueError:
        raise ValueError(
            f"{key}={name!r} is not accepted: expected one of {', '.join(strategy_names())} "
            "(or an alias such as bestFit, leastLoaded, roundRobin, binpack, spread; case, '-' "
            "and '_' are ignored)"
        ) from None


def check_scoring_weights(weights: Any, key: str = "scoring_weights") -> dict[str, float]:
    """`weights` as the four named weights (a name left out weighs 0); ValueError naming the bad entry."""
    names = {_norm(n): n for n in DEFAULT_SCORING_WEIGHTS}
    accepted = ", ".join(DEFAULT_SCORING_WEIGHTS)
    if not isinstance(weights, Mapping):
        raise ValueError(
            f"{key}={weights!r} is not accepted: expected a mapping of {accepted} to numbers >= 0"
        )
    out = dict.fromkeys(DEFAULT_SCORING_WEIGHTS, 0.0)
    for raw, value in weights.items():
        name = names.get(_norm(raw))
        if name is None:
            raise ValueError(
                f"{key}.{raw}={value!r} is not accepted: {raw!r} is no scoring weight; "
                f"expected one of {accepted}"
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(f"{key}.{raw}={value!r} is not accepted: expected a number >= 0")
        out[name] = float(value)
    if not any(out.values()):
        raise ValueError(
            f"{key}={dict(weights)!r} is not accepted: expected at least one weight above 0 (of {accepted})"
        )
    return out


def check_leaf_limit(value: Any, key: str) -> int:
    """A per-leaf gang limit: an integer from 0 (no limit) up; ValueError naming `key` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LEAF_LIMIT:
        raise ValueError(
            f"{key}={value!r} is not accepted: expected an integer from 0 (no limit) to {MAX_LEAF_LIMIT}"
        )
    return value


def check_external_threshold(value: Any, key: str = "external_memory_threshold_mib") -> int:
    """MiB of GPU memory used outside Kubernetes from which a device is not placed on (0 = never)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EXTERNAL_MIB:
        raise ValueError(
            f"{key}={value!r} is not accepted: expected an integer number of MiB from 0 (never block a "
            f"device) to {MAX_EXTERNAL_MIB}"
        )
    return value


def check_label_key(value: Any, key: str) -> str:
    """A Node label key (leaf_label, spine_label); ValueError naming `key` and the value otherwise."""
    if not isinstance(value, str) or not _LABEL_KEY.match(value):
        raise ValueError(
            f"{key}={value!r} is not accepted: expected a Kubernetes label key such as "
            "topology.scheduler/leaf (an optional DNS prefix and '/', then a name of up to 63 "
            "letters, digits, '-', '_' or '.')"
        )
    return value


@dataclass(frozen=True)
class LedgerSettings:
    """What may change on a running ledger: the default strategy, the `balanced` strategy's scoring
    weights, the per-leaf limits a gang gets when its request sets none (0 = no limit) and the external GPU
    memory threshold apply from the next decision; the leaf/spine label keys need a rebuild (the nodes are
    filed under them)."""

    default_strategy: str = "fgd_host"
    scoring_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SCORING_WEIGHTS))
    max_nodes_per_leaf: int = 0
    max_gpus_per_leaf: int = 0
    leaf_label: str = LedgerConfig.leaf_label
    spine_label: str = LedgerConfig.spine_label
    # a device whose GPU memory processes outside Kubernetes use at or above this (the node agent's
    # agentaflow.gpu/device-holders "external") is not placed on; 0 = never. Live from the next decision.
    external_memory_threshold_mib: int = LedgerConfig.external_memory_threshold_mib

    def __post_init__(self) -> None:
        object.__setattr__(self, "default_strategy", check_strategy(self.default_strategy))
        object.__setattr__(self, "scoring_weights", check_scoring_weights(self.scoring_weights))
        for key in ("max_nodes_per_leaf", "max_gpus_per_leaf"):
            check_leaf_limit(getattr(self, key), key)
        for key in ("leaf_label", "spine_label"):
            check_label_key(getattr(self, key), key)
        check_external_threshold(self.external_memory_threshold_mib)
        if self.leaf_label == self.spine_label:
            raise ValueError(
                f"leaf_label={self.leaf_label!r} is not accepted: expected a label key other than "
                f"spine_label ({self.spine_label!r})"
            )

    @property
    def labels(self) -> tuple[str, str]:
        return self.leaf_label, self.spine_label

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "scoring_weights": dict(self.scoring_weights)}

    def fingerprint(self) -> str:
        """Equal settings, equal fingerprint: a replica re-pushing the config it pushed before changes
        nothing."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_config(cls, config: LedgerConfig) -> LedgerSettings:
        return cls(
            default_strategy=config.default_strategy,
            scoring_weights=dict(config.balanced_weights),
            leaf_label=config.leaf_label,
            spine_label=config.spine_label,
            external_memory_threshold_mib=config.external_memory_threshold_mib,
        )

    def applied_to(self, config: LedgerConfig) -> LedgerConfig:
        """`config` with these settings in it (what the ledger reads them from)."""
        return replace(
            config,
            default_strategy=self.default_strategy,
            balanced_weights=dict(self.scoring_weights),
            leaf_label=self.leaf_label,
            spine_label=self.spine_label,
            external_memory_threshold_mib=self.external_memory_threshold_mib,
        )
