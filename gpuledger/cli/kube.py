"""The operator CLI's and the client helper's Kubernetes API access, on the `kubernetes` client.

Each call goes through the client's typed API for its group (CoreV1Api, BatchV1Api, AppsV1Api,
CustomObjectsApi); the answer is read raw and decoded as JSON, so the views and `-o json` see exactly what the
API server stored (its own timestamps and field names), not a generated model's rendering of it. Dicts in and
out, errors as KubeError carrying the API's own message. Never decides anything: callers interpret.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuledger import names

# GPUWorkload lives in both groups the earlier tools' users have; GPUNode in agentaflow.io only
GPUWORKLOAD_VERSIONS = (names.AGENTAFLOW_API_VERSION, names.WARP_API_VERSION)
GPUNODE_VERSION = names.AGENTAFLOW_API_VERSION
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# the client's typed API for each built-in group the CLI writes; custom resources go through CustomObjectsApi
TYPED_APIS = {"v1": "CoreV1Api", "batch/v1": "BatchV1Api", "apps/v1": "AppsV1Api"}


@dataclass(frozen=True)
class Kind:
    """A namespaced kind the CLI reads or writes, and how the client's typed APIs name it."""

    api_version: str
    kind: str
    plural: str
    method_suffix: str = (
        ""  # `read_namespaced_<suffix>` on its typed API (TYPED_APIS); "" for a custom resource
    )

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


KINDS = {
    (k.api_version, k.kind): k
    for k in (
        Kind("v1", "Pod", "pods", "pod"),
        Kind("v1", "ConfigMap", "configmaps", "config_map"),
        Kind("batch/v1", "Job", "jobs", "job"),
        Kind("apps/v1", "Deployment", "deployments", "deployment"),
        Kind("apps/v1", "StatefulSet", "statefulsets", "stateful_set"),
        *(Kind(v, "GPUWorkload", names.GPUWORKLOAD_PLURAL) for v in GPUWORKLOAD_VERSIONS),
    )
}


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        accepted = ", ".join(f"{k} ({v})" for v, k in KINDS)
        raise ValueError(
            f"kind={kind!r} apiVersion={api_version!r} is not accepted: expected one of {accepted}"
        ) from None


class KubeError(RuntimeError):
    """An API call that failed: `status` is the HTTP status (0 when the API could not be reached)."""

    def __init__(self, status: int, message: str, reason: str = ""):
        super().__init__(message)
        self.status, self.reason = status, reason

    @property
    def not_found(self) -> bool:
        return self.status == 404


@dataclass
class Kube:
    """One cluster, reached with a `kubernetes.client.ApiClient`."""

    api_client: Any
    namespace: str = "default"  # the kubeconfig context's namespace: where commands work without -n
    timeout_s: float = 30.0
    _apis: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> Kube:
        """The kubeconfig named (or $KUBECONFIG, ~/.kube/config), else the in-cluster service account."""
        from kubernetes import client, config

        path = kubeconfig or os.environ.get("KUBECONFIG") or None  # the client merges a $KUBECONFIG list
        try:
            api_client = config.new_client_from_config(config_file=path, context=context)
            contexts, active = config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
            namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
            return cls(api_client, namespace)
        except (config.ConfigException, OSError, TypeError) as exc:
            if kubeconfig or context:
                raise KubeError(0, f"kubeconfig {kubeconfig or path or '~/.kube/config'}: {exc}") from exc
            in_cluster = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=in_cluster)
            except config.ConfigException:
                raise KubeError(0, f"no kubeconfig ({exc}) and not running in a cluster") from exc
            sa = Path(SERVICE_ACCOUNT_NAMESPACE)
            namespace = sa.read_text().strip() if sa.exists() else "default"
            return cls(client.ApiClient(in_cluster), namespace)

    # ------------------------------------------------------------------ the typed APIs and one call
    def _api(self, name: str) -> Any:
        """The client's typed API `name` (e.g. CoreV1Api) on this cluster's ApiClient, made once."""
        if name not in self._apis:
            from kubernetes import client

            self._apis[name] = getattr(client, name)(self.api_client)
        return self._apis[name]

    def _typed(self, k: Kind) -> Any:
        return self._api(TYPED_APIS[k.api_version])

    @property
    def core(self) -> Any:
        return self._api("CoreV1Api")

    @property
    def custom(self) -> Any:
        return self._api("CustomObjectsApi")

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
        """One API call; the API server's JSON answer as it sent it. Raises KubeError with its message."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            answer = method(*args, _preload_content=False, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            raise _api_error(exc.status, exc.body, exc.reason) from exc
        except HTTPError as exc:
            raise KubeError(0, f"cannot reach the API server: {exc}") from exc
        data = answer.data
        return json.loads(data) if data else {}

    def _items(self, method: Callable[..., Any], *args: Any, selector: str | None = None) -> list[dict]:
        """The list's items; [] when the resource is not served (a CRD not installed)."""
        try:
            answer = self._call(method, *args, **({"label_selector": selector} if selector else {}))
        except KubeError as exc:
            if exc.not_found:
                return []
            raise
        return list(answer.get("items") or [])

    # ------------------------------------------------------------------ any kind of KINDS
    def read(self, api_version: str, kind: str, name: str, namespace: str) -> dict | None:
        """The object, or None when it does not exist."""
        k = kind_of(api_version, kind)
        try:
            if not k.method_suffix:
                return self._call(
                    self.custom.get_namespaced_custom_object, k.group, k.version, namespace, k.plural, name
                )
            return self._call(getattr(self._typed(k), f"read_namespaced_{k.method_suffix}"), name, namespace)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def create(self, obj: dict, namespace: str) -> dict:
        k = kind_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        if not k.method_suffix:
            return self._call(
                self.custom.create_namespaced_custom_object, k.group, k.version, namespace, k.plural, obj
            )
        return self._call(getattr(self._typed(k), f"create_namespaced_{k.method_suffix}"), namespace, obj)

    def apply(self, obj: dict, namespace: str, field_manager: str, dry_run: bool = False) -> dict:
        """Server-side apply of `obj` (its metadata.name) in `namespace`; the stored object."""
        k = kind_of(obj["apiVersion"], obj["kind"])
        name = obj["metadata"]["name"]
        options: dict[str, Any] = {"field_manager": field_manager, "_content_type": APPLY_PATCH}
        if dry_run:
            options["dry_run"] = "All"
        if not k.method_suffix:
            patch = self.custom.patch_namespaced_custom_object
            return self._call(patch, k.group, k.version, namespace, k.plural, name, obj, **options)
        patch = getattr(self._typed(k), f"patch_namespaced_{k.method_suffix}")
        return self._call(patch, name, namespace, obj, **options)

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API serves this custom resource (its CRD is installed)."""
        group, _, version = api_version.rpartition("/")
        try:
            found = self._call(self.custom.get_api_resources, group, version)
        except KubeError as exc:
            if exc.not_found:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources") or ())

    # ------------------------------------------------------------------ what the commands read and write
    def nodes(self) -> list[dict]:
        return self._items(self.core.list_node)

    def pods(self, namespace: str | None = None) -> list[dict]:
        if namespace is None:
            return self._items(self.core.list_pod_for_all_namespaces)
        return self._items(self.core.list_namespaced_pod, namespace)

    def config_maps(self, namespace: str) -> list[dict]:
        return self._items(self.core.list_namespaced_config_map, namespace)

    def patch_config_map(self, name: str, namespace: str, patch: dict) -> dict:
        """A JSON merge patch (a resourceVersion in it makes a concurrent edit fail with 409)."""
        return self._call(
            self.core.patch_namespaced_config_map, name, namespace, patch, _content_type=MERGE_PATCH
        )

    def gpu_workloads(self, namespace: str | None = None) -> list[dict]:
        """GPUWorkloads of both groups ([] for a group whose CRD is not installed)."""
        out: list[dict] = []
        for api_version in GPUWORKLOAD_VERSIONS:
            group, _, version = api_version.partition("/")
            if namespace is None:
                out += self._items(
                    self.custom.list_cluster_custom_object, group, version, names.GPUWORKLOAD_PLURAL
                )
            else:
                out += self._items(
                    self.custom.list_namespaced_custom_object,
                    group,
                    version,
                    namespace,
                    names.GPUWORKLOAD_PLURAL,
                )
        return out

    def gpu_nodes(self) -> list[dict]:
        return self._items(
            self.custom.list_cluster_custom_object,
            names.AGENTAFLOW_GROUP,
            names.AGENTAFLOW_VERSION,
            names.GPUNODE_PLURAL,
        )

    def gpu_queues(self) -> list[dict]:
        """GPUQueue objects (cluster-scoped; [] when the CRD is not installed)."""
        return self._items(
            self.custom.list_cluster_custom_object,
            names.QUEUE_GROUP,
            names.QUEUE_VERSION,
            names.GPUQUEUE_PLURAL,
        )

    def namespaces(self) -> list[dict]:
        return self._items(self.core.list_namespace)

    def resource_slices(self) -> list[dict]:
        """ResourceSlice objects (resource.k8s.io/v1; [] on a Kubernetes that does not serve it)."""
        return self._items(
            self.custom.list_cluster_custom_object,
            names.RESOURCE_GROUP,
            names.RESOURCE_VERSION,
            names.RESOURCE_SLICE_PLURAL,
        )

    def namespace_opted_in(self, namespace: str) -> bool | None:
        """True/False by the admission label; None when the namespace does not exist."""
        try:
            ns = self._call(self.core.read_namespace, namespace)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise
        labels = (ns.get("metadata") or {}).get("labels") or {}
        return labels.get(names.ADMISSION_LABEL) == names.ADMISSION_ENABLED


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
