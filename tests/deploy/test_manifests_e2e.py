"""The install against a real kube-apiserver (devcluster/): RBAC as granted, server-side dry-run of
every overlay, and the restricted Pod Security Standard enforced on every pod the install would run.

Only the ServiceAccount, ClusterRole and ClusterRoleBinding are created for real (and removed afterwards):
real webhook configurations with failurePolicy Fail would gate other tests' pods on a webhook that is not
running. Everything else goes through `--dry-run=server`, which runs validation and admission, stores nothing.
"""

from __future__ import annotations

import copy
import subprocess
import uuid

import pytest
import yaml

from tests.deploy.test_manifests import (
    BASE,
    CRD_KINDS,
    NAMESPACE,
    OVERLAYS,
    SERVICE_ACCOUNT,
    all_pod_specs,
    objects,
    one,
    render,
)

pytestmark = pytest.mark.e2e

SA_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
NOBODY = f"system:serviceaccount:{NAMESPACE}:nobody-{uuid.uuid4().hex[:6]}"


def ensure_namespace(apiserver, name: str, labels: dict | None = None) -> None:
    if apiserver.kubectl("get", "namespace", name, check=False).returncode != 0:
        apiserver.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        )


@pytest.fixture(scope="module")
def installed_rbac(apiserver):
    docs = render(BASE)
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    ensure_namespace(apiserver, NAMESPACE)
    apiserver.apply(rbac)
    yield docs
    for d in rbac:
        args = ["delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"]
        if "namespace" in d["metadata"]:
            args += ["-n", d["metadata"]["namespace"]]
        apiserver.kubectl(*args, check=False)


def can_i(apiserver, verb: str, resource: str, namespace: str | None = "team-a", user: str = SA_USER) -> bool:
    """`resource` may name a subresource after a colon (pods:eviction); a slash names an object."""
    resource, _, subresource = resource.partition(":")
    args = ["auth", "can-i", verb, resource, "--as", user]
    args += ["--subresource", subresource] if subresource else []
    args += ["-n", namespace] if namespace else []
    proc = apiserver.kubectl(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stderr
    return answer == "yes"


def rules_of(apiserver, user: str, namespace: str = "team-a") -> set[tuple[str, str, str, str]]:
    """`kubectl auth can-i --list` as (resource, non-resource URLs, resource names, verbs) rows."""
    out = apiserver.kubectl("auth", "can-i", "--list", "--as", user, "-n", namespace).stdout.splitlines()
    header = out[0]
    starts = [header.index(col) for col in ("Resources", "Non-Resource URLs", "Resource Names", "Verbs")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return {tuple(line[a:b].strip() for a, b in bounds) for line in out[1:] if line.strip()}


def role_rows(role: dict) -> set[tuple[str, str, str, str]]:
    """What `can-i --list` should show for a ClusterRole: one row per resource, `plural.group` names."""
    rows = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                name = f"{resource}.{group}" if group else resource
                rows.add(
                    (
                        name,
                        "[]",
                        f"[{' '.join(rule.get('resourceNames', []))}]",
                        f"[{' '.join(rule['verbs'])}]",
                    )
                )
    return rows


def test_service_account_can_do_what_the_role_grants_and_no_more(apiserver, installed_rbac):
    role = one(installed_rbac, "ClusterRole", "gpuledger")
    # the GPUWorkload controller runs beside the webhook, as the same ServiceAccount (docs/operator.md)
    controller = one(installed_rbac, "ClusterRole", "gpuledger-controller")
    # everything beyond what any authenticated identity already has comes from our ClusterRoles, exactly
    baseline = rules_of(apiserver, NOBODY)
    assert _sorted_verbs(rules_of(apiserver, SA_USER) - baseline) == _sorted_verbs(
        _merged(role_rows(role) | role_rows(controller))
    )


def _sorted_verbs(rows: set[tuple[str, str, str, str]]) -> set[tuple[str, str, str, str]]:
    """The rows with each one's verbs in one order: kubectl lists two roles' verbs for a resource in the
    order it met the roles, which varies."""
    return {(*row[:3], f"[{' '.join(sorted(row[3].strip('[]').split()))}]") for row in rows}


def _merged(rows: set[tuple[str, str, str, str]]) -> set[tuple[str, str, str, str]]:
    """`can-i --list` shows one row per resource and resource names: the verbs of two roles joined."""
    verbs: dict[tuple[str, str, str], set[str]] = {}
    order: dict[tuple[str, str, str], list[str]] = {}
    for resource, urls, names, row_verbs in rows:
        name, _, group = resource.partition(".")
        if "/" in name:  # a subresource: kubectl writes `plural.group/sub`
            plural, _, sub = name.partition("/")
            resource = f"{plural}.{group}/{sub}" if group else name
        key = (resource, urls, names)
        for verb in row_verbs.strip("[]").split():
            if verb not in verbs.setdefault(key, set()):
                verbs[key].add(verb)
                order.setdefault(key, []).append(verb)
    return {(*key, f"[{' '.join(order[key])}]") for key in verbs}


@pytest.mark.parametrize(
    "verb,resource,namespaced,allowed",
    [
        ("list", "pods", True, True),
        ("watch", "pods", True, True),
        ("patch", "pods", True, True),  # the placement of a pod that waited, its gate removed
        ("list", "nodes", False, True),
        ("get", "jobs.batch", True, True),
        ("get", "statefulsets.apps", True, True),
        ("get", "replicasets.apps", True, True),
        ("get", "deployments.apps", True, True),
        ("get", "pytorchjobs.kubeflow.org", True, True),
        ("get", "mpijobs.kubeflow.org", True, True),
        ("get", "tfjobs.kubeflow.org", True, True),
        ("get", "podgroups.scheduling.k8s.io", True, True),
        ("get", "workloads.scheduling.k8s.io", True, True),
        ("list", "podgroups.scheduling.k8s.io", True, False),
        ("create", "events", True, True),
        ("create", "events.events.k8s.io", True, True),
        ("update", "mutatingwebhookconfigurations/gpuledger-mutating", False, True),
        ("patch", "validatingwebhookconfigurations/gpuledger-validating", False, True),
        # and nothing more
        ("create", "pods", True, False),
        ("delete", "pods", True, False),
        ("update", "pods:status", True, False),
        ("create", "pods:exec", True, False),
        ("create", "pods:eviction", True, True),  # a preemption's victims, through the Eviction API
        ("watch", "namespaces", False, True),
        ("list", "poddisruptionbudgets.policy", True, True),
        ("watch", "gpuqueues.gpuledger.io", False, True),
        ("watch", "resourceslices.resource.k8s.io", False, True),
        ("create", "resourceslices.resource.k8s.io", False, False),
        ("patch", "gpuqueues.gpuledger.io:status", False, True),
        ("update", "gpuqueues.gpuledger.io:status", False, False),
        ("update", "gpuqueues.gpuledger.io", False, False),
        ("patch", "gpuqueues.gpuledger.io", False, False),
        ("create", "poddisruptionbudgets.policy", True, False),
        ("patch", "namespaces", False, False),
        ("create", "pods:binding", True, False),
        ("patch", "nodes", False, False),
        ("update", "nodes/status", False, False),
        ("get", "secrets", True, False),
        ("list", "secrets", True, False),
        ("get", "secrets", None, False),
        ("get", "configmaps", True, False),
        # the GPUWorkload controller beside the webhook creates (and deletes) each attempt's Job
        ("create", "jobs.batch", True, True),
        ("update", "jobs.batch", True, False),
        ("watch", "gpuworkloads.agentaflow.io", True, True),
        ("update", "gpuworkloads.gpu.warp.dev", True, False),
        ("delete", "gpuworkloads.agentaflow.io", True, False),
        ("delete", "statefulsets.apps", True, False),
        ("list", "deployments.apps", True, False),
        ("update", "replicasets.apps", True, False),
        ("create", "pytorchjobs.kubeflow.org", True, False),
        ("list", "tfjobs.kubeflow.org", True, False),
        ("update", "mutatingwebhookconfigurations/someone-else", False, False),
        ("delete", "mutatingwebhookconfigurations/gpuledger-mutating", False, False),
        ("create", "mutatingwebhookconfigurations", False, False),
        ("list", "validatingwebhookconfigurations", False, False),
        ("update", "events", True, False),
        ("create", "serviceaccounts/token", True, False),
        ("impersonate", "users", False, False),
        ("create", "clusterrolebindings", False, False),
        ("escalate", "clusterroles", False, False),
    ],
)
def test_can_i_matrix(apiserver, installed_rbac, verb, resource, namespaced, allowed):
    assert can_i(apiserver, verb, resource, "team-a" if namespaced else None) is allowed


def server_dry_run(apiserver, docs) -> subprocess.CompletedProcess:
    for ns in {NAMESPACE} | {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}:
        ensure_namespace(apiserver, ns)  # a dry run creates no namespace for the objects after it
    builtin = [d for d in docs if d["kind"] not in CRD_KINDS]
    text = yaml.safe_dump_all(builtin)
    return apiserver.kubectl("apply", "--dry-run=server", "-f", "-", input=text, check=False)


@pytest.mark.parametrize("name", list(OVERLAYS))
def test_overlay_passes_server_side_dry_run(apiserver, name):
    docs = render(OVERLAYS[name])
    proc = server_dry_run(apiserver, docs)
    assert proc.returncode == 0, proc.stderr
    applied = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len([d for d in docs if d["kind"] not in CRD_KINDS])


def test_certs_output_directory_passes_server_side_dry_run(apiserver, tmp_path):
    from gpuledger.certs import cli

    out = tmp_path / "tls"
    assert cli.main(["generate", "--out", str(out), "--overlay", str(OVERLAYS["dev"])]) == 0
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(out)], capture_output=True, text=True, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    proc = server_dry_run(apiserver, docs)
    assert proc.returncode == 0, proc.stderr
    assert (
        "secret/gpuledger-tls created (server dry run)" in proc.stdout
        or "secret/gpuledger-tls configured" in proc.stdout
    )


@pytest.fixture(scope="module")
def restricted_namespace(apiserver):
    name = f"gpuledger-pss-{uuid.uuid4().hex[:6]}"
    apiserver.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            },
        }
    )
    yield name
    apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def pod_from(spec: dict, namespace: str, name: str) -> dict:
    spec = copy.deepcopy(spec)
    spec.pop("priorityClassName", None)  # a dry run does not create the PriorityClass it would name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.mark.parametrize("name", ["prod"])
def test_every_pod_is_admitted_under_the_restricted_pod_security_standard(
    apiserver, restricted_namespace, name
):
    # the node agent is not among them: it lives in its own privileged namespace (hostPID and the kubelet's
    # PodResources socket; tests/deploy/test_manifests.py::test_node_agent_is_confined_to_what_it_reads)
    specs = [s for s in all_pod_specs(render(OVERLAYS[name])) if s[0] != "DaemonSet/gpuledger-node-agent"]
    assert len(specs) >= 4  # webhook, redis, ray head, ray workers
    for i, (where, spec) in enumerate(specs):
        text = yaml.safe_dump(pod_from(spec, restricted_namespace, f"pss-{i}"))
        proc = apiserver.kubectl("create", "--dry-run=server", "-f", "-", input=text, check=False)
        assert proc.returncode == 0, f"{where}: {proc.stderr}"


def test_pod_security_enforcement_is_active_in_the_check_namespace(apiserver, restricted_namespace):
    """The control for the test above: a pod that escalates privileges is refused there."""
    spec = copy.deepcopy(objects(render(OVERLAYS["dev"]), "Deployment")[0]["spec"]["template"]["spec"])
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    text = yaml.safe_dump(pod_from(spec, restricted_namespace, "pss-control"))
    proc = apiserver.kubectl("create", "--dry-run=server", "-f", "-", input=text, check=False)
    assert proc.returncode != 0 and "allowPrivilegeEscalation" in proc.stderr
