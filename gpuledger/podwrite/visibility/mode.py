"""What a device-visibility mode is: the rules one mode states for the pods the webhook writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# a mode's variables for a container: text, a `valueFrom` dict, or None to remove the variable
Env = dict[str, Any]
# a placed pod's: text or None (its devices are known now, nothing is read later)
PlacedEnv = dict[str, str | None]


@dataclass(frozen=True)
class VisibilityMode:
    """One way a container is shown its GPUs (docs/webhook.md, "Visibility modes")."""

    name: str
    # the variables of each GPU container of a placed pod, from its devices' indices and uuids (same order)
    placed: Callable[[Sequence[int], Sequence[str]], PlacedEnv]
    # the variables of each GPU container of a pod admitted to wait for `count` devices (none chosen yet)
    waiting: Callable[[int], Env]
    # the variables of the pod's other containers (None: left as they are)
    others: Env | None = None
    # whether the kubelet's device plugin picks the devices (the pod must ask it for them by a GPU limit)
    kubelet_picks: bool = False
