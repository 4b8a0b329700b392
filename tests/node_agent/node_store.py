"""Stands in for the CoreV1Api calls the node agent makes (read_node, patch_node, patch_node_status), for unit
tests of the agent's loop; the real API server path is tests/e2e/test_node_agent_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace


class NodeStore:
    """One Node's annotations and resourceVersion; a patch's null annotation removes it, as strategic merge
    does, a stale resourceVersion is refused with status 409, and a patch answers the Node it left."""

    def __init__(self, annotations: dict[str, str] | None = None):
        self.annotations: dict[str, str] = dict(annotations or {})
        self.version = 1
        self.patches: list[dict] = []
        self.status_patches: list[dict] = []

    def read_node(self, name):
        return self._node()

    def _node(self):
        meta = SimpleNamespace(annotations=dict(self.annotations), resource_version=str(self.version))
        return SimpleNamespace(metadata=meta)

    def patch_node(self, name, body):
        meta = dict(body["metadata"])
        if meta.pop("resourceVersion", str(self.version)) != str(self.version):
            raise Conflict()
        for key, value in meta.get("annotations", {}).items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value
        self.version += 1
        self.patches.append({**body, "metadata": meta})
        return self._node()

    def patch_node_status(self, name, body):
        self.status_patches.append(body)
        self.version += 1
        return self._node()

    def annotate(self, key: str, value: str | None) -> None:
        """Another writer (`kubectl annotate`) changes the Node."""
        self.patch_node("", {"metadata": {"annotations": {key: value}}})


class Conflict(Exception):
    status = 409
