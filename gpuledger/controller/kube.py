"""The controller's writes to the Kubernetes API: GPUWorkload status, Jobs, GPUNodes. Blocking calls.

Status writes carry the resourceVersion the controller last read, so a write decided on a stale object (a
replica that lost its Lease, a watch that lags) fails with a conflict instead of acting twice.
Decides nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuledger.names import (
    AGENTAFLOW_API_VERSION,
    AGENTAFLOW_GROUP,
    AGENTAFLOW_VERSION,
    GPUNODE_PLURAL,
    GPUWORKLOAD_PLURAL,
)

log = logging.getLogger("gpuledger.controller.kube")

FIELD_MANAGER = "gpuledger-controller"


class Conflict(Exception):
    """The object changed since it was read (or is gone): re-read, decide again."""


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` at the top level (removed keys become null)."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new})
    return patch


class KubeWriter:
    def __init__(self, api_client: Any):
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)

    # ---------------------------------------------------------------- GPUWorkload
    def write_status(self, obj: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the status, conditional on the resourceVersion of `obj`; the stored object back."""
        group, _, version = obj["apiVersion"].partition("/")
        meta = obj["metadata"]
        body = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": merge_patch(obj.get("status") or {}, status),
        }
        try:
            stored = self.custom.patch_namespaced_custom_object_status(
                group,
                version,
                meta["namespace"],
                GPUWORKLOAD_PLURAL,
                meta["name"],
                body,
                field_manager=FIELD_MANAGER,
            )
            return cast(dict[str, Any], stored)
        except ApiException as err:
            if err.status in (404, 409):
                raise Conflict(f"{meta['namespace']}/{meta['name']}: {err.reason}") from err
            raise

    def get_workload(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        group, _, version = obj["apiVersion"].partition("/")
        meta = obj["metadata"]
        try:
            stored = self.custom.get_namespaced_custom_object(
                group, version, meta["namespace"], GPUWORKLOAD_PLURAL, meta["name"]
            )
            return cast(dict[str, Any], stored)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    # ---------------------------------------------------------------- Jobs
    def create_job(self, job: Mapping[str, Any]) -> bool:
        """True when created, False when a Job of that name exists already (this attempt's, made before)."""
        try:
            body = cast(Any, job)  # the client sends a dict as it is
            self.batch.create_namespaced_job(job["metadata"]["namespace"], body, field_manager=FIELD_MANAGER)
            return True
        except ApiException as err:
            if err.status == 409:
                return False
            raise

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete the Job; the garbage collector deletes its pods, whose GPUs the sync then releases."""
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        except ApiException as err:
            if err.status != 404:
                raise

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.batch.read_namespaced_job, name, namespace)

    def read_node(self, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_node, name)

    def read_namespace(self, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_namespace, name)

    def _read(self, method: Any, *args: str) -> dict[str, Any] | None:
        """The object as the watches deliver it (a plain dict with the API's field names), or None."""
        try:
            return self.api_client.sanitize_for_serialization(method(*args))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    # ---------------------------------------------------------------- GPUNode
    def write_gpunode(self, name: str, status: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
        """Create the GPUNode when this controller has not written it yet, then set its status."""
        if old is None:
            body = {
                "apiVersion": AGENTAFLOW_API_VERSION,
                "kind": "GPUNode",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER}},
            }
            try:
                self.custom.create_cluster_custom_object(
                    AGENTAFLOW_GROUP, AGENTAFLOW_VERSION, GPUNODE_PLURAL, body
                )
            except ApiException as err:
                if err.status != 409:
                    raise
            stored = cast(
                dict[str, Any],
                self.custom.get_cluster_custom_object(
                    AGENTAFLOW_GROUP, AGENTAFLOW_VERSION, GPUNODE_PLURAL, name
                ),
            )
            old = stored.get("status") or {}
        patch = {"status": merge_patch(old, status)}
        self.custom.patch_cluster_custom_object_status(
            AGENTAFLOW_GROUP, AGENTAFLOW_VERSION, GPUNODE_PLURAL, name, patch
        )

    def delete_gpunode(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(
                AGENTAFLOW_GROUP, AGENTAFLOW_VERSION, GPUNODE_PLURAL, name
            )
        except ApiException as err:
            if err.status != 404:
                raise
