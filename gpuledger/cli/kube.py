"""Raw Kubernetes API access for the CLI and the client helper: JSON dicts in and out, errors as KubeError.

Dicts rather than the client's generated models, because the views read custom resources and annotations
alike and the manifests users submit are dicts already. Never decides anything: callers interpret.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADMISSION_LABEL = "gpuledger.io/admission"
ADMISSION_ENABLED = "enabled"
# GPUWorkload lives in both groups the earlier tools' users have; GPUNode in agentaflow.io only
GPUWORKLOAD_VERSIONS = ("agentaflow.io/v1", "gpu.warp.dev/v1alpha1")
GPUNODE_VERSION = "agentaflow.io/v1"
# kinds `submit` and the client create, with their plural resource names
PLURALS = {
    "Pod": "pods",
    "Job": "jobs",
    "GPUWorkload": "gpuworkloads",
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "GPUNode": "gpunodes",
    "ConfigMap": "configmaps",
}


class KubeError(RuntimeError):
    """An API call that failed: `status` is the HTTP status (0 when the API could not be reached)."""

    def __init__(self, status: int, message: str, reason: str = ""):
        super().__init__(message)
        self.status, self.reason = status, reason

    @property
    def not_found(self) -> bool:
        return self.status == 404


def collection_path(api_version: str, plural: str, namespace: str | None = None) -> str:
    """`/api/v1/namespaces/ns/pods`, `/apis/batch/v1/jobs` (all namespaces when namespace is None)."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{plural}" if namespace else f"{root}/{plural}"


def object_path(api_version: str, plural: str, name: str, namespace: str | None = None) -> str:
    return f"{collection_path(api_version, plural, namespace)}/{name}"


@dataclass
class Kube:
    """One cluster, reached with a `kubernetes.client.ApiClient`."""

    api_client: Any
    namespace: str = "default"  # the kubeconfig context's namespace: where commands work without -n
    timeout_s: float = 30.0

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> Kube:
        """The kubeconfig named (or $KUBECONFIG, ~/.kube/config), else the in-cluster service account."""
        from kubernetes import config

        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        try:
            api_client = config.new_client_from_config(config_file=path, context=context)
            contexts, active = config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
            namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
            return cls(api_client, namespace)
        except (config.ConfigException, OSError, TypeError) as exc:
            if kubeconfig or context:
                raise KubeError(0, f"kubeconfig {kubeconfig or path or '~/.kube/config'}: {exc}") from exc
            try:
                config.load_incluster_config()
            except config.ConfigException:
                raise KubeError(0, f"no kubeconfig ({exc}) and not running in a cluster") from exc
            from kubernetes import client

            sa_namespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
            namespace = Path(sa_namespace).read_text().strip() if os.path.exists(sa_namespace) else "default"
            return cls(client.ApiClient(), namespace)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict | None = None,
        content_type: str = "application/json",
    ) -> dict:
        """One API call; the decoded JSON answer. Raises KubeError with the API's own message."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = list((query or {}).items())
        try:
            if hasattr(self.api_client, "param_serialize"):  # kubernetes >= 33 (openapi-generator 7)
                method_, url, headers_, body_, post = self.api_client.param_serialize(
                    method=method,
                    resource_path=path,
                    query_params=params,
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                )
                resp = self.api_client.call_api(
                    method_,
                    url,
                    header_params=headers_,
                    body=body_,
                    post_params=post,
                    _request_timeout=self.timeout_s,
                )
                resp.read()
            else:  # the older generated client
                resp = self.api_client.call_api(
                    path,
                    method,
                    query_params=params,
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=self.timeout_s,
                )
        except ApiException as exc:
            raise _api_error(exc.status, exc.body, exc.reason) from exc
        except HTTPError as exc:
            raise KubeError(0, f"cannot reach the API server: {exc}") from exc
        status = int(getattr(resp, "status", 200) or 200)
        if status >= 400:
            raise _api_error(status, resp.data, getattr(resp, "reason", ""))
        data = resp.data
        return json.loads(data) if data else {}

    def get(self, path: str) -> dict | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def items(self, path: str, selector: str | None = None) -> list[dict]:
        """The items; [] when the resource is not served (a CRD not installed)."""
        try:
            answer = self.request("GET", path, query={"labelSelector": selector} if selector else None)
        except KubeError as exc:
            if exc.not_found:
                return []
            raise
        return list(answer.get("items") or [])

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API serves this resource (its CRD is installed)."""
        root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        found = self.get(root) or {}
        return any(r.get("name") == plural for r in found.get("resources") or ())

    def create(self, obj: dict, namespace: str | None) -> dict:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        plural = PLURALS.get(kind) or kind.lower() + "s"
        return self.request("POST", collection_path(api_version, plural, namespace), body=obj)

    def patch(self, path: str, patch: dict, kind: str = "merge") -> dict:
        ctype = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[kind]
        return self.request("PATCH", path, body=patch, content_type=ctype)

    def delete(self, path: str, propagation: str = "Background") -> dict:
        return self.request("DELETE", path, body={"propagationPolicy": propagation})

    # ------------------------------------------------------------------ what the views read
    def nodes(self) -> list[dict]:
        return self.items("/api/v1/nodes")

    def pods(self, namespace: str | None = None) -> list[dict]:
        return self.items(collection_path("v1", "pods", namespace))

    def gpu_workloads(self, namespace: str | None = None) -> list[dict]:
        """GPUWorkloads of both groups ([] for a group whose CRD is not installed)."""
        out: list[dict] = []
        for version in GPUWORKLOAD_VERSIONS:
            out += self.items(collection_path(version, "gpuworkloads", namespace))
        return out

    def gpu_nodes(self) -> list[dict]:
        return self.items(collection_path(GPUNODE_VERSION, "gpunodes"))

    def namespace_opted_in(self, namespace: str) -> bool | None:
        """True/False by the admission label; None when the namespace does not exist."""
        ns = self.get(f"/api/v1/namespaces/{namespace}")
        if ns is None:
            return None
        return ((ns.get("metadata") or {}).get("labels") or {}).get(ADMISSION_LABEL) == ADMISSION_ENABLED


def _api_error(status: Any, body: Any, reason: Any) -> KubeError:
    """The API's Status message (what kubectl prints) as a KubeError."""
    message, why = str(reason or ""), ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        answer = json.loads(body or "{}")
        message, why = answer.get("message") or message, answer.get("reason") or ""
    except (ValueError, TypeError, AttributeError):
        if body:
            message = str(body)
    return KubeError(int(status or 0), message, why)
