"""gpuledger's scheduling gate: a pod admitted to wait carries it until its placement is written."""

from __future__ import annotations

from typing import Any

from gpuledger.names import SCHEDULING_GATE
from gpuledger.podwrite.copy_on_write import dict_at, list_at


def is_ours(gate: Any) -> bool:
    return isinstance(gate, dict) and gate.get("name") == SCHEDULING_GATE


def index_of(pod: dict) -> int | None:
    """Where gpuledger's gate is among the pod's scheduling gates; None when the pod does not carry it."""
    gates = list_at(dict_at(pod, "spec"), "schedulingGates")
    return next((i for i, g in enumerate(gates) if is_ours(g)), None)
