"""Strategy names -> factories: the plug-in registry the ledger and the request parser resolve names through.
Pure and empty on its own: importing gpuledger.strategies registers the built-ins (the service does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuledger.core.plugins.plugin import Strategy

_FACTORIES: dict[str, Callable[[], Strategy]] = {}
_ALIASES: dict[str, str] = {}  # normalised alias -> canonical name
_INSTANCES: dict[str, Strategy] = {}


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "").replace(" ", "")


def register(name: str, factory: Callable[[], Strategy], aliases: Iterable[str] = ()) -> None:
    """Make a strategy available under `name` (and aliases; matching ignores case, '-' and '_')."""
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)
    for alias in (name, *aliases):
        _ALIASES[_norm(alias)] = name


def strategy_names() -> list[str]:
    """Canonical names of every registered strategy."""
    return sorted(_FACTORIES)


def accepted_names() -> list[str]:
    """Every spelling `get_strategy` accepts: canonical names and aliases (normalised)."""
    return sorted(set(_ALIASES) | set(_FACTORIES))


def canonical_name(name: str) -> str:
    """The registered name for any accepted spelling; ValueError listing the accepted names otherwise."""
    canonical = _ALIASES.get(_norm(str(name)))
    if canonical is None:
        raise ValueError(
            f"unknown placement strategy {name!r}; accepted: {', '.join(strategy_names())} "
            f"(aliases: leastLoaded, least_loaded, bestFit, roundRobin, costOptimized, binpack, spread; "
            f"case, '-' and '_' are ignored)"
        )
    return canonical


def get_strategy(name: str) -> Strategy:
    canonical = canonical_name(name)
    inst = _INSTANCES.get(canonical)
    if inst is None:
        inst = _INSTANCES[canonical] = _FACTORIES[canonical]()
    return inst
