"""A cluster described by a YAML file (Nodes and Pods, e.g. `kubectl get nodes,pods -A -o yaml`).

The offline source of truth for `gpuledger explain` and `gpuledger serve --cluster FILE`: read again
whenever the ledger is rebuilt, so a file that includes placed pods restores their placements.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from gpuledger.core.pods.objects import iter_objects, kind_of
from gpuledger.names import RESERVATION_ID_KEY


def load_objects(path: str | Path) -> list[dict]:
    """Every object in a YAML stream of objects and Lists."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: large clusters load fast
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.load_all(f, Loader=loader) if d is not None]
    return list(iter_objects(docs))  # iter_objects yields only dicts


def reservation_ids(objects: Iterable[dict]) -> set[str]:
    """Reservation ids carried by the (non-terminal) pods among `objects`."""
    ids = set()
    for obj in objects:
        if kind_of(obj) != "Pod":
            continue
        labels = (obj.get("metadata") or {}).get("labels") or {}
        terminal = (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if RESERVATION_ID_KEY in labels and not terminal:
            ids.add(str(labels[RESERVATION_ID_KEY]))
    return ids


class FileSource:
    """Rebuild-from-file source; `objects()` re-reads the file so edits (placed pods) are seen."""

    kind = "file"

    def __init__(self, path: str | Path):
        self.path = str(Path(path).resolve())

    def objects(self) -> list[dict]:
        return load_objects(self.path)

    def spec(self) -> dict[str, Any]:
        return {"kind": "file", "path": self.path}

    def __repr__(self) -> str:
        return f"file:{self.path}"


class ExternalSource:
    """The Kubernetes API, fed in from outside by gpuledger.sync.cluster_sync (`resync` / `apply_events`)."""

    kind = "kubernetes"

    def objects(self) -> None:
        return None

    def spec(self) -> dict[str, Any]:
        return {"kind": "kubernetes"}

    def __repr__(self) -> str:
        return "kubernetes"


class ObjectsSource:
    """A fixed list of objects (tests, explain from stdin)."""

    kind = "objects"

    def __init__(self, objects: Iterable[dict]):
        self._objects = list(objects)

    def objects(self) -> list[dict]:
        return list(self._objects)

    def spec(self) -> dict[str, Any]:
        return {"kind": "objects", "objects": self._objects}

    def __repr__(self) -> str:
        return f"objects:{len(self._objects)}"


def source_from_spec(spec: dict | None):
    """The source a spec names (specs are what travels to the Ray actor and survives its restarts)."""
    spec = spec or {"kind": "kubernetes"}
    kind = spec.get("kind")
    if kind == "file":
        return FileSource(spec["path"])
    if kind == "objects":
        return ObjectsSource(spec.get("objects") or [])
    if kind == "kubernetes":
        return ExternalSource()
    raise ValueError(f"ledger source kind {kind!r}: expected file, objects or kubernetes")
