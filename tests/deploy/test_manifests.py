"""The rendered install, overlay by overlay: schema-valid, and every deployment property read from the output.

Each overlay is rendered with `kubectl kustomize` and parsed; assertions compare rendered objects with each
other (the Service the webhooks call is the Service that exists, the Secret mounted is the one issued...),
never with strings copied from the manifests.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
import yaml

from gpuledger.certs import pki

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "manifests"
OVERLAYS = {name: REPO / "kustomize" / "overlays" / name for name in ("dev", "prod", "cert-manager")}
# the supported releases whose schemas kubernetes-validate ships (1.38 is checked against the API server's
# discovery in tests/e2e/test_api_versions.py)
K8S_SCHEMA_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
NAMESPACE = "gpuledger-system"
AGENT_NAMESPACE = "gpuledger-node-agent"  # the node agent alone, Pod Security privileged (hostPath, hostPID)
SERVICE_ACCOUNT = "gpuledger"

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with kustomize) not on PATH"
)


# ---------------------------------------------------------------------------------------------- rendering
@functools.cache
def render(path: Path) -> tuple[dict, ...]:
    proc = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed: {proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def objects(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind: str, name: str | None = None) -> dict:
    found = [d for d in objects(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, (
        f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels + matchExpressions In/NotIn/Exists) applied to a label set."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def webhook_deployment(docs) -> dict:
    return one(docs, "Deployment", "gpuledger")


def webhook_container(docs) -> dict:
    containers = webhook_deployment(docs)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "webhook")


def container_argv(container: dict) -> list[str]:
    return list(container.get("command", [])) + list(container.get("args", []))


def shell_lines(container: dict) -> list[list[str]]:
    """The commands a container runs: its argv, or each line of an `sh -c` script, tokenised."""
    argv = container_argv(container)
    if argv[:2] == ["sh", "-c"]:
        return [shlex.split(line) for line in argv[2].splitlines() if line.strip()]
    return [argv]


def serve_argv(container: dict) -> list[str]:
    for tokens in shell_lines(container):
        tokens = tokens[1:] if tokens[:1] == ["exec"] else tokens
        if tokens[:2] == ["gpuledger", "serve"]:
            return tokens
    raise AssertionError(f"no `gpuledger serve` in {container_argv(container)}")


def flag(argv: list[str], name: str) -> str | None:
    for i, token in enumerate(argv):
        if token == name:
            return argv[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None


def mount_for(container: dict, pod_spec: dict, file_path: str) -> tuple[dict, dict]:
    """The volumeMount whose directory holds `file_path`, and its volume."""
    parent = str(PurePosixPath(file_path).parent)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == parent)
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
    return mount, volume


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, argument) pairs with continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            pairs.append((instruction.upper(), rest.strip()))
    return pairs


def all_pod_specs(docs) -> list[tuple[str, dict]]:
    specs = [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in objects(docs, "Deployment") + objects(docs, "DaemonSet")
    ]
    for rc in objects(docs, "RayCluster"):
        specs.append(
            (f"RayCluster/{rc['metadata']['name']}/head", rc["spec"]["headGroupSpec"]["template"]["spec"])
        )
        for group in rc["spec"].get("workerGroupSpecs", []):
            specs.append(
                (f"RayCluster/{rc['metadata']['name']}/{group['groupName']}", group["template"]["spec"])
            )
    return specs


# ------------------------------------------------------------------------------ schemas of the CRD kinds
CRD_KINDS = {"RayCluster", "ServiceMonitor", "Certificate", "Issuer"}
POD_TEMPLATE = "pod-template"  # validated as a real Pod by kubernetes-validate
GO_DURATION = re.compile(r"^(\d+(\.\d+)?(h|m|s|ms|us|ns))+$")
CERT_USAGES = {
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
}
STR_MAP = {"*": str}
LABEL_SELECTOR = {
    "?matchLabels": STR_MAP,
    "?matchExpressions": [{"key": str, "operator": str, "?values": [str]}],
}
METADATA = {"name": str, "?namespace": str, "?labels": STR_MAP, "?annotations": STR_MAP}
ISSUER_REF = {"name": str, "?kind": {"Issuer", "ClusterIssuer"}, "?group": {"cert-manager.io"}}
RAY_GROUP_COMMON = {"?rayStartParams": STR_MAP, "template": POD_TEMPLATE}
# Hand-checked against the published CRDs: KubeRay ray.io/v1 (1.3+), prometheus-operator
# monitoring.coreos.com/v1, cert-manager.io/v1. Only the fields used here are listed; an unknown one fails.
CRD_SCHEMAS: dict[tuple[str, str], dict] = {
    ("ray.io/v1", "RayCluster"): {
        "apiVersion": str,
        "kind": str,
        "metadata": METADATA,
        "spec": {
            "?rayVersion": str,
            "?enableInTreeAutoscaling": bool,
            "?gcsFaultToleranceOptions": {
                "redisAddress": str,
                "?externalStorageNamespace": str,
                "?redisPassword": {"?value": str, "?valueFrom": dict},
                "?redisUsername": {"?value": str, "?valueFrom": dict},
            },
            "headGroupSpec": {"?serviceType": {"ClusterIP", "NodePort", "LoadBalancer"}, **RAY_GROUP_COMMON},
            "?workerGroupSpecs": [
                {
                    "groupName": str,
                    "?replicas": int,
                    "minReplicas": int,
                    "maxReplicas": int,
                    **RAY_GROUP_COMMON,
                }
            ],
        },
    },
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "apiVersion": str,
        "kind": str,
        "metadata": METADATA,
        "spec": {
            "selector": LABEL_SELECTOR,
            "?namespaceSelector": {"?matchNames": [str], "?any": bool},
            "endpoints": [
                {
                    "?port": str,
                    "?path": str,
                    "?scheme": {"http", "https"},
                    "?interval": GO_DURATION,
                    "?scrapeTimeout": GO_DURATION,
                    "?tlsConfig": {
                        "?serverName": str,
                        "?insecureSkipVerify": bool,
                        "?ca": {
                            "?secret": {"name": str, "key": str},
                            "?configMap": {"name": str, "key": str},
                        },
                    },
                }
            ],
        },
    },
    ("cert-manager.io/v1", "Certificate"): {
        "apiVersion": str,
        "kind": str,
        "metadata": METADATA,
        "spec": {
            "secretName": str,
            "issuerRef": ISSUER_REF,
            "?commonName": str,
            "?dnsNames": [str],
            "?ipAddresses": [str],
            "?isCA": bool,
            "?duration": GO_DURATION,
            "?renewBefore": GO_DURATION,
            "?usages": [CERT_USAGES],
            "?privateKey": {
                "?algorithm": {"RSA", "ECDSA", "Ed25519"},
                "?size": int,
                "?rotationPolicy": {"Never", "Always"},
                "?encoding": {"PKCS1", "PKCS8"},
            },
        },
    },
    ("cert-manager.io/v1", "Issuer"): {
        "apiVersion": str,
        "kind": str,
        "metadata": METADATA,
        "spec": {"?selfSigned": {}, "?ca": {"secretName": str}},
    },
}


def check_structure(value, spec, path: str = "") -> list[str]:
    """Errors of `value` against a small spec: a type, a set of allowed values, a regex, a list of one spec,
    a dict of fields ("?" prefix = optional, "*" = any key), or POD_TEMPLATE."""
    if spec is POD_TEMPLATE:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "template", **value.get("metadata", {})},
            "spec": value["spec"],
        }
        for version in K8S_SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(pod, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                return [f"{path}: pod template ({version}): {exc.message} at {list(exc.path)}"]
        return []
    if isinstance(spec, type):
        ok = isinstance(value, spec) and not (spec is int and isinstance(value, bool))
        return [] if ok else [f"{path}: expected {spec.__name__}, got {value!r}"]
    if isinstance(spec, set):
        return [] if value in spec else [f"{path}: {value!r} not one of {sorted(spec)}"]
    if isinstance(spec, re.Pattern):
        return (
            [] if isinstance(value, str) and spec.match(value) else [f"{path}: {value!r} !~ {spec.pattern}"]
        )
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [e for i, item in enumerate(value) for e in check_structure(item, spec[0], f"{path}[{i}]")]
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected an object"]
        if "*" in spec:
            return [e for k, v in value.items() for e in check_structure(v, spec["*"], f"{path}.{k}")]
        fields = {k.lstrip("?"): (k.startswith("?"), s) for k, s in spec.items()}
        errors = [f"{path}.{k}: unknown field" for k in value if k not in fields]
        errors += [
            f"{path}.{k}: required" for k, (optional, _) in fields.items() if not optional and k not in value
        ]
        for k, v in value.items():
            if k in fields:
                errors += check_structure(v, fields[k][1], f"{path}.{k}")
        return errors
    raise TypeError(f"bad spec at {path}: {spec!r}")


def validate(doc: dict) -> list[str]:
    if doc["kind"] in CRD_KINDS:
        spec = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if spec is None:
            return [f"{doc['kind']}: no hand-checked schema for apiVersion {doc['apiVersion']}"]
        return check_structure(doc, spec, doc["kind"])
    for version in K8S_SCHEMA_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = f"{doc['kind']}/{doc['metadata'].get('name')} ({version})"
            return [f"{where}: {exc.message} at {list(exc.path)}"]
    return []


ALL = [BASE, *OVERLAYS.values()]
IDS = ["base", *OVERLAYS]


# ----------------------------------------------------------------------------------------- every overlay
@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_renders_and_passes_schema_validation(path):
    docs = render(path)
    assert docs
    errors = [e for doc in docs for e in validate(doc)]
    assert errors == []


def test_validator_is_strict():
    """The checks above would catch a typo: an invented field fails both validators."""
    deployment = json.loads(json.dumps(webhook_deployment(render(BASE))))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    assert validate(deployment)
    ray = json.loads(json.dumps(one(render(OVERLAYS["prod"]), "RayCluster")))
    ray["spec"]["headGroupSpec"]["rayStartParam"] = {}
    ray["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert len(validate(ray)) == 2


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_namespaced_objects_live_in_the_gpuledger_namespace(path):
    docs = render(path)
    namespaces = {d["metadata"]["name"] for d in objects(docs, "Namespace")}
    agent = {d["metadata"]["name"] for d in objects(docs, "DaemonSet")}
    assert namespaces == ({NAMESPACE, AGENT_NAMESPACE} if agent else {NAMESPACE})
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "CustomResourceDefinition",
    }
    for d in docs:
        if d["kind"] not in cluster_scoped:
            agent = d["metadata"]["name"] == "gpuledger-node-agent"
            assert d["metadata"].get("namespace") == (AGENT_NAMESPACE if agent else NAMESPACE), d["metadata"]


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_every_pod_meets_the_restricted_pod_security_standard(path):
    docs = render(path)
    labels = one(docs, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for where, spec in all_pod_specs(docs):
        if where == "DaemonSet/gpuledger-node-agent":
            continue  # its own namespace and standard: test_node_agent_is_confined_to_what_it_reads
        pod_sc = spec.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, where
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), where
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, (where, c["name"])
            assert sc.get("readOnlyRootFilesystem") is True, (where, c["name"])
            assert sc.get("runAsNonRoot") is True, (where, c["name"])
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], (where, c["name"])
            assert not sc.get("capabilities", {}).get("add"), (where, c["name"])
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", (where, c["name"])
            assert sc.get("privileged") in (None, False), (where, c["name"])
            # requests and limits on everything: the webhook must not be starved or starve its node
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c.get("resources", {}).get(kind, {})), (
                    where,
                    c["name"],
                    kind,
                )
        # a read-only root needs somewhere to write: every Ray/webhook pod mounts /tmp
        mounts = {m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        assert "/tmp" in mounts or where.startswith("Deployment/gpuledger-redis"), where


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_every_priority_class_named_is_rendered(path):
    docs = render(path)
    classes = {d["metadata"]["name"] for d in objects(docs, "PriorityClass")}
    for where, spec in all_pod_specs(docs):
        assert spec.get("priorityClassName") in classes, where
    for pc in objects(docs, "PriorityClass"):
        assert pc["globalDefault"] is False
        assert pc["value"] < 2_000_000_000  # below the system-* classes reserved for the cluster itself


# --------------------------------------------------------------------------------------------- webhook
@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_webhook_deployment(path):
    docs = render(path)
    deployment = webhook_deployment(docs)
    pod = deployment["spec"]["template"]
    spec, labels = pod["spec"], pod["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"], labels)
    assert spec["serviceAccountName"] == SERVICE_ACCOUNT
    assert one(docs, "ServiceAccount", SERVICE_ACCOUNT)

    # one replica per node
    terms = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname" and selects(t["labelSelector"], labels) for t in terms
    )

    # a PodDisruptionBudget covers the pods
    pdbs = [p for p in objects(docs, "PodDisruptionBudget") if selects(p["spec"]["selector"], labels)]
    assert len(pdbs) == 1
    pdb = pdbs[0]["spec"]
    replicas = deployment["spec"]["replicas"]
    allowed_down = pdb.get("maxUnavailable", replicas - pdb.get("minAvailable", 0))
    assert 1 <= allowed_down < max(replicas, 2)

    container = webhook_container(docs)
    argv = serve_argv(container)
    port = int(flag(argv, "--port"))
    assert port == 8443
    named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named_ports["https"] == port
    # probes over HTTPS on the serving port
    for probe, path_ in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path_ and get["scheme"] == "HTTPS"
        assert named_ports.get(get["port"], get["port"]) == port

    # TLS from the Secret, mounted as a directory (subPath mounts never see Secret updates: no rotation)
    cert_mount, cert_volume = mount_for(container, spec, flag(argv, "--tls-cert"))
    key_mount, key_volume = mount_for(container, spec, flag(argv, "--tls-key"))
    assert cert_volume is key_volume and "secret" in cert_volume
    assert "subPath" not in cert_mount and cert_mount["readOnly"] is True
    assert cert_volume["secret"]["secretName"] == "gpuledger-tls"
    # configuration from the generated ConfigMap, which carries the file the flag names
    config_path = flag(argv, "--config")
    _, config_volume = mount_for(container, spec, config_path)
    config_map = one(docs, "ConfigMap", config_volume["configMap"]["name"])
    assert PurePosixPath(config_path).name in config_map["data"]
    yaml.safe_load(config_map["data"][PurePosixPath(config_path).name])
    # the HMAC placement key from a Secret, as the file --hmac-key-file names
    key_file = flag(argv, "--hmac-key-file")
    _, key_volume = mount_for(container, spec, key_file)
    assert key_volume["secret"]["secretName"] == "gpuledger-placement-key"
    assert PurePosixPath(key_file).name == "key"
    # reachable from outside the pod (serve binds 127.0.0.1 unless told otherwise)
    assert flag(argv, "--host") == "0.0.0.0"
    # one port: AdmissionReviews, probes and /metrics
    assert list(named_ports) == ["https"]
    # rolling updates: keep serving while endpoints drop the pod, inside the grace period
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    seconds = int(re.search(r"sleep[\s\"',]+(\d+)", " ".join(pre_stop)).group(1))
    assert 0 < seconds < spec["terminationGracePeriodSeconds"]


def test_serve_accepts_the_rendered_arguments():
    """Every overlay's `gpuledger serve` argv parses with the real CLI parser, and the mounted config
    loads."""
    serve = pytest.importorskip("gpuledger.webhook.serve")
    config_module = pytest.importorskip("gpuledger.webhook.config")
    for path in ALL:
        docs = render(path)
        argv = serve_argv(webhook_container(docs))
        args = serve.build_parser().parse_args(argv[2:])
        assert args.port == 8443 and args.hmac_key_file
        config_path = flag(argv, "--config")
        _, volume = mount_for(
            webhook_container(docs), webhook_deployment(docs)["spec"]["template"]["spec"], config_path
        )
        text = one(docs, "ConfigMap", volume["configMap"]["name"])["data"][PurePosixPath(config_path).name]
        config = config_module.WebhookConfig.from_mapping(yaml.safe_load(text))
        # the webhook's own deadline leaves room inside the API server's timeout
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            assert config.deadline_s < one(docs, kind)["webhooks"][0]["timeoutSeconds"]
        assert f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}" in config.privileged_usernames
        assert config.fail_open is False


def test_image_entrypoint_runs_the_webhook_args():
    """Containers that set only args rely on the image ENTRYPOINT; it must be an init that execs them."""
    entrypoint = [json.loads(arg) for ins, arg in dockerfile() if ins == "ENTRYPOINT"][-1]
    assert PurePosixPath(entrypoint[0]).name == "tini" and entrypoint[-1] == "--"
    for path in ALL:
        container = webhook_container(render(path))
        assert "command" not in container
        assert serve_argv(container)


def test_dockerfile_is_multi_stage_and_non_root_matching_the_pods():
    instructions = dockerfile()
    stages = [arg for ins, arg in instructions if ins == "FROM"]
    assert len(stages) >= 2
    assert any(ins == "COPY" and arg.startswith("--from=") for ins, arg in instructions)
    user = [arg for ins, arg in instructions if ins == "USER"][-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it
    for path in ALL:
        spec = webhook_deployment(render(path))["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsUser"] == int(uid)
        assert spec["securityContext"]["runAsGroup"] == int(gid or uid)
    # the image the manifests name is the one this Dockerfile documents building
    images = {
        c["image"]
        for path in ALL
        for _, s in all_pod_specs(render(path))
        for c in s["containers"]
        if "gpuledger" in c["image"]
    }
    assert len(images) == 1
    assert f"-t {images.pop()} ." in (REPO / "Dockerfile").read_text()


def test_dockerignore_keeps_secrets_and_the_venv_out():
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and line[0] != "#"
    ]
    assert lines[0] == "*"  # deny by default, then allow only the package sources
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed <= {"pyproject.toml", "README.md", "gpuledger"}
    copied = {arg.split()[0] for ins, arg in dockerfile() if ins == "COPY" and not arg.startswith("--from")}
    assert copied <= allowed


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_service_routes_to_the_webhook_pods(path):
    docs = render(path)
    service = one(docs, "Service", "gpuledger")
    pod_labels = webhook_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    container_ports = {p["name"]: p["containerPort"] for p in webhook_container(docs)["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in container_ports


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_webhook_configurations(path):
    docs = render(path)
    service = one(docs, "Service", "gpuledger")
    service_ports = {p["port"]: p for p in service["spec"]["ports"]}
    mutating = one(docs, "MutatingWebhookConfiguration", "gpuledger-mutating")
    validating = one(docs, "ValidatingWebhookConfiguration", "gpuledger-validating")
    expected = {
        id(mutating): ("/mutate", ["CREATE"], ["pods"]),
        id(validating): ("/validate", ["CREATE", "UPDATE"], ["pods", "pods/ephemeralcontainers"]),
    }
    for config in (mutating, validating):
        (webhook,) = config["webhooks"]
        path_, operations, resources = expected[id(config)]
        ref = webhook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (
            service["metadata"]["name"],
            service["metadata"]["namespace"],
        )
        assert ref["path"] == path_
        assert service_ports[ref.get("port", 443)]["targetPort"] == "https"
        assert webhook["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": operations,
                "resources": resources,
                "scope": "Namespaced",
            }
        ]
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["sideEffects"] == "NoneOnDryRun"
        assert webhook["timeoutSeconds"] <= 5
        assert webhook["matchPolicy"] == "Equivalent"
        assert webhook["failurePolicy"] == "Fail"
        # opt-in namespaces only, and never kube-system or our own namespace even if labelled
        selector = webhook["namespaceSelector"]
        on = {"gpuledger.io/admission": "enabled"}
        assert selects(selector, {**on, "kubernetes.io/metadata.name": "team-a"})
        assert not selects(selector, {"kubernetes.io/metadata.name": "team-a"})
        for excluded in ("kube-system", NAMESPACE):
            assert not selects(selector, {**on, "kubernetes.io/metadata.name": excluded})
    assert mutating["webhooks"][0]["reinvocationPolicy"] == "IfNeeded"


def test_webhook_names_match_what_certs_patches():
    """`gpuledger certs generate` patches caBundle by configuration and webhook name."""
    from gpuledger.certs import render as certs_render

    docs = render(BASE)
    for kind, config, webhook in (
        ("MutatingWebhookConfiguration", certs_render.MUTATING_CONFIG, certs_render.MUTATING_WEBHOOK),
        ("ValidatingWebhookConfiguration", certs_render.VALIDATING_CONFIG, certs_render.VALIDATING_WEBHOOK),
    ):
        assert [w["name"] for w in one(docs, kind, config)["webhooks"]] == [webhook]
    assert webhook_container(docs) and certs_render.TLS_SECRET == "gpuledger-tls"


# ------------------------------------------------------------------------------------------------ RBAC
def test_rbac_is_least_privilege():
    docs = render(BASE)
    role = one(docs, "ClusterRole", "gpuledger")
    binding = one(docs, "ClusterRoleBinding", "gpuledger")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpuledger",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
    ]
    # the only namespaced role: the controller's leader-election Lease
    assert [r["metadata"]["name"] for r in objects(docs, "Role")] == ["gpuledger-controller-lease"]
    assert [r["roleRef"]["name"] for r in objects(docs, "RoleBinding")] == ["gpuledger-controller-lease"]
    granted, names = _grants(role)
    read = {"get", "list", "watch"}
    assert granted == {
        ("", "pods"): read | {"patch"},  # patch: the placement of a pod that waited (gpuledger.sync.placer)
        ("", "nodes"): read,
        # queues and preemption (gpuledger.sync.cluster_sync, evictor, queue_status)
        ("", "namespaces"): {"list", "watch"},
        ("policy", "poddisruptionbudgets"): {"list", "watch"},
        ("gpuledger.io", "gpuqueues"): {"list", "watch"},
        ("resource.k8s.io", "resourceslices"): {"list", "watch"},  # GPUs published through DRA
        ("gpuledger.io", "gpuqueues/status"): {"patch"},
        ("", "pods/eviction"): {"create"},  # through the Eviction API: budgets and grace honoured
        ("batch", "jobs"): read,
        ("apps", "statefulsets"): read,
        ("apps", "replicasets"): {"get"},
        ("apps", "deployments"): {"get"},
        ("kubeflow.org", "pytorchjobs"): {"get"},
        ("kubeflow.org", "mpijobs"): {"get"},
        ("kubeflow.org", "tfjobs"): {"get"},
        ("scheduling.k8s.io", "podgroups"): {"get"},
        ("scheduling.k8s.io", "workloads"): {"get"},
        ("", "events"): {"create"},
        ("events.k8s.io", "events"): {"create"},
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"get", "update", "patch"},
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): {"get", "update", "patch"},
    }
    # write access to webhook configurations only by name, and only to the ones rendered here
    assert names == {
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): [
            one(docs, "MutatingWebhookConfiguration")["metadata"]["name"]
        ],
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): [
            one(docs, "ValidatingWebhookConfiguration")["metadata"]["name"]
        ],
    }


def _grants(role: dict) -> tuple[dict[tuple[str, str], set[str]], dict[tuple[str, str], list[str]]]:
    granted: dict[tuple[str, str], set[str]] = {}
    names: dict[tuple[str, str], list[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in (group, resource) and "*" not in rule["verbs"]
                granted.setdefault((group, resource), set()).update(rule["verbs"])
                if "resourceNames" in rule:
                    names[(group, resource)] = rule["resourceNames"]
    return granted, names


def test_controller_rbac_is_least_privilege():
    """The GPUWorkload controller's additions to the webhook's ServiceAccount, and the users' roles: GPUNodes
    are read-only for every user role."""
    docs = render(BASE)
    read = {"get", "list", "watch"}
    status = {"get", "update", "patch"}
    sa = [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
    binding = one(docs, "ClusterRoleBinding", "gpuledger-controller")
    assert binding["roleRef"]["name"] == "gpuledger-controller" and binding["subjects"] == sa
    granted, names = _grants(one(docs, "ClusterRole", "gpuledger-controller"))
    assert names == {}
    assert granted == {
        ("agentaflow.io", "gpuworkloads"): read,
        ("gpu.warp.dev", "gpuworkloads"): read,
        ("agentaflow.io", "gpuworkloads/status"): status,
        ("gpu.warp.dev", "gpuworkloads/status"): status,
        ("agentaflow.io", "gpunodes"): read | {"create", "delete"},
        ("agentaflow.io", "gpunodes/status"): status,
        ("batch", "jobs"): read | {"create", "delete"},
        ("", "pods"): read,
        ("", "nodes"): read,
        ("", "namespaces"): read,
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    }
    lease_binding = one(docs, "RoleBinding", "gpuledger-controller-lease")
    assert lease_binding["subjects"] == sa
    granted, names = _grants(one(docs, "Role", "gpuledger-controller-lease"))
    assert granted == {("coordination.k8s.io", "leases"): {"create", "get", "update", "patch"}}
    assert names == {("coordination.k8s.io", "leases"): ["gpuledger-controller"]}
    argv = container_argv(
        next(
            c
            for c in webhook_deployment(docs)["spec"]["template"]["spec"]["containers"]
            if c["name"] == "controller"
        )
    )
    assert argv[argv.index("--lease-name") + 1] == "gpuledger-controller"
    # users: no write verb on GPUNodes in any aggregated role
    for role in objects(docs, "ClusterRole"):
        if any(
            k.startswith("rbac.authorization.k8s.io/aggregate-to-")
            for k in role["metadata"].get("labels", {})
        ):
            granted, _ = _grants(role)
            for (_group, resource), verbs in granted.items():
                if resource.startswith("gpunodes"):
                    assert verbs <= read, (role["metadata"]["name"], resource, verbs)


# ---------------------------------------------------------------------------------------- network policy
def ingress_peers(docs, pod_labels: dict, namespace_labels: dict | None = None):
    """(port or None for all, peer) pairs admitted to pods with these labels by the rendered policies."""
    admitted = []
    for policy in objects(docs, "NetworkPolicy"):
        if not selects(policy["spec"]["podSelector"], pod_labels):
            continue
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])] or [None]
            peers = rule.get("from") or [None]
            admitted += [(port, peer) for port in ports for peer in peers]
    return admitted


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_network_policy_admits_only_the_apiserver_prometheus_and_ray(path):
    docs = render(path)
    pod_labels = webhook_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    (https,) = [p["containerPort"] for p in webhook_container(docs)["ports"]]
    admitted = ingress_peers(docs, pod_labels)
    # the API server (not selectable by label) and Prometheus reach the one HTTPS port
    assert (https, None) in admitted
    # anything admitted on every port comes from the Ray cluster or the other webhook pods, and only in prod
    ray_clusters = [rc["metadata"]["name"] for rc in objects(docs, "RayCluster")]
    for port, peer in admitted:
        assert port == https or (
            port is None
            and ray_clusters
            and peer is not None
            and (
                selects(peer["podSelector"], {"ray.io/cluster": ray_clusters[0]})
                or selects(peer["podSelector"], pod_labels)
            )
        ), (port, peer)
    if not ray_clusters:
        assert admitted == [(https, None)]


def test_ray_and_redis_only_talk_to_each_other_and_the_webhook():
    docs = render(OVERLAYS["prod"])
    rc = one(docs, "RayCluster")
    ray_labels = {
        "ray.io/cluster": rc["metadata"]["name"],
        **rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"],
    }
    webhook_labels = webhook_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    admitted = ingress_peers(docs, ray_labels)
    assert admitted
    for _, peer in admitted:
        assert peer is not None
        assert selects(peer["podSelector"], ray_labels) or selects(peer["podSelector"], webhook_labels)
    redis = one(docs, "Deployment", "gpuledger-redis")
    redis_labels = redis["spec"]["template"]["metadata"]["labels"]
    redis_port = redis["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    admitted = ingress_peers(docs, redis_labels)
    assert admitted and all(
        port == redis_port and selects(peer["podSelector"], ray_labels) for port, peer in admitted
    )
    assert not any(selects(peer["podSelector"], webhook_labels) for _, peer in admitted)


# ------------------------------------------------------------------------------------------------- Ray
def test_dev_runs_one_replica_with_an_embedded_ray():
    docs = render(OVERLAYS["dev"])
    assert not objects(docs, "RayCluster")
    deployment = webhook_deployment(docs)
    # each embedded Ray is its own ledger: a second replica (or a surge pod) would double-book GPUs
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    argv = serve_argv(webhook_container(docs))
    assert flag(argv, "--ray-address") is None
    assert not any(tokens[:2] == ["ray", "start"] for tokens in shell_lines(webhook_container(docs)))


@pytest.mark.parametrize("name", ["prod", "cert-manager"])
def test_prod_webhook_pods_join_the_ray_cluster_as_nodes(name):
    docs = render(OVERLAYS[name])
    deployment = webhook_deployment(docs)
    assert deployment["spec"]["replicas"] >= 2
    container = webhook_container(docs)
    rc = one(docs, "RayCluster")
    env = {e["name"]: e.get("value") for e in container["env"]}
    lines = shell_lines(container)
    starts = [tokens for tokens in lines if tokens[:2] == ["ray", "start"]]
    assert len(starts) == 1
    start = starts[0]
    # joins the cluster's head (KubeRay names its head Service <cluster>-head-svc) on the GCS port
    address = flag(start, "--address").replace("${RAY_HEAD_ADDRESS}", env["RAY_HEAD_ADDRESS"])
    host, port = address.rsplit(":", 1)
    assert host.split(".")[:2] == [f"{rc['metadata']['name']}-head-svc", rc["metadata"]["namespace"]]
    head_ports = {
        p["name"]: p["containerPort"]
        for p in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert int(port) == head_ports["gcs-server"]
    # a CPU-less node: the ledger actor (which needs a CPU) is never placed on a webhook pod
    assert flag(start, "--num-cpus") == "0" and flag(start, "--num-gpus") == "0"
    assert "--head" not in start and "--block" not in start
    # then the driver attaches to this pod's raylet, after the node has started
    assert lines.index(start) < lines.index(next(t for t in lines if "serve" in t))
    assert flag(serve_argv(container), "--ray-address") == "auto"
    # never Ray Client: its proxy adds a round trip per call
    rendered = yaml.safe_dump_all(list(docs))
    assert "ray://" not in rendered
    # survive a head restart: keep reconnecting to the GCS longer than the head takes to come back
    assert int(env["RAY_gcs_rpc_server_reconnect_timeout_s"]) >= 60
    # same image everywhere: the actor's code must import on the Ray workers, with the same Ray and Python
    images = {
        c["image"] for _, spec in all_pod_specs(docs) for c in spec["containers"] if "redis" not in c["image"]
    }
    assert images == {container["image"]}


def test_ray_cluster_has_gcs_fault_tolerance_on_the_rendered_redis():
    docs = render(OVERLAYS["prod"])
    rc = one(docs, "RayCluster")
    assert rc["apiVersion"] == "ray.io/v1"
    host, port = rc["spec"]["gcsFaultToleranceOptions"]["redisAddress"].rsplit(":", 1)
    name, namespace = host.split(".")[:2]
    service = one(docs, "Service", name)
    assert service["metadata"]["namespace"] == namespace
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    redis = one(docs, "Deployment", name)
    assert selects(
        {"matchLabels": service["spec"]["selector"]}, redis["spec"]["template"]["metadata"]["labels"]
    )
    # the legacy annotation must not be combined with gcsFaultToleranceOptions
    assert "ray.io/ft-enabled" not in rc["metadata"].get("annotations", {})
    # the head takes no actors, so a head restart leaves the ledger actor (on a worker) running
    assert rc["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    workers = rc["spec"]["workerGroupSpecs"]
    assert sum(g["minReplicas"] for g in workers) >= 2
    assert all(int(g["rayStartParams"]["num-cpus"]) >= 1 for g in workers)


def test_ray_version_matches_the_image():
    docs = render(OVERLAYS["prod"])
    args = dict(arg.split("=", 1) for ins, arg in dockerfile() if ins == "ARG" and "=" in arg)
    assert one(docs, "RayCluster")["spec"]["rayVersion"] == args["RAY_VERSION"]


# ------------------------------------------------------------------------------------------ cert-manager
def test_cert_manager_issues_the_mounted_secret_for_the_service_names():
    docs = render(OVERLAYS["cert-manager"])
    service = one(docs, "Service", "gpuledger")
    tls_volume = next(
        v for v in webhook_deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
    )
    serving = next(
        c
        for c in objects(docs, "Certificate")
        if c["spec"]["secretName"] == tls_volume["secret"]["secretName"]
    )
    spec = serving["spec"]
    assert spec["dnsNames"] == pki.service_dns_names(
        service["metadata"]["name"], service["metadata"]["namespace"]
    )
    assert "server auth" in spec["usages"] and spec["privateKey"]["algorithm"] == "ECDSA"
    assert not spec.get("isCA")

    def hours(text: str) -> float:
        return sum(
            float(v) * {"h": 1, "m": 1 / 60, "s": 1 / 3600}[u]
            for v, u in re.findall(r"([\d.]+)([hms])", text)
        )

    # renewed at two thirds of its lifetime, like `gpuledger certs rotate`
    assert hours(spec["renewBefore"]) / hours(spec["duration"]) == pytest.approx(1 / 3)
    # the issuer chain resolves to rendered objects and ends in a CA certificate whose key survives renewal
    issuers = {i["metadata"]["name"]: i for i in objects(docs, "Issuer")}
    ca_issuer = issuers[spec["issuerRef"]["name"]]
    ca_cert = next(
        c
        for c in objects(docs, "Certificate")
        if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]
    )
    assert ca_cert["spec"]["isCA"] is True
    assert ca_cert["spec"]["privateKey"]["rotationPolicy"] == "Never"
    assert "selfSigned" in issuers[ca_cert["spec"]["issuerRef"]["name"]]["spec"]
    # both webhook configurations take their caBundle from that Certificate
    ref = f"{serving['metadata']['namespace']}/{serving['metadata']['name']}"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(docs, kind)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == ref
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_overlays_without_cert_manager_carry_no_injection():
    for name in ("dev", "prod"):
        docs = render(OVERLAYS[name])
        assert not objects(docs, "Certificate")
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            assert "cert-manager.io/inject-ca-from" not in one(docs, kind)["metadata"].get("annotations", {})


# ------------------------------------------------------------------------------------------- monitoring
# the metrics the webhook exports (gpuledger/webhook/metrics.py, when present, is the authority: see
# known_metrics)
EXPORTED_METRICS = {
    "agentaflow_gpu_total",
    "agentaflow_gpu_available",
    "agentaflow_gpu_utilization",
    "agentaflow_workloads_pending",
    "agentaflow_workloads_running",
    "agentaflow_scheduling_duration",
    "gpuledger_ledger_claim_duration_seconds",
    "gpuledger_ledger_actor_calls_total",
    "gpuledger_ledger_actor_call_seconds_total",
    "topology_scheduler_latency_seconds",
    "topology_placement_decisions_total",
    "topology_domain_utilization_ratio",
    "topology_gpu_allocation_ratio",
    "topology_domain_fragmentation_ratio",
    "gpuledger_admission_duration_seconds",
    "gpuledger_admission_in_flight",
    "gpuledger_handler_failures_total",
    "topology_scheduler_placement_duration_seconds",
    "topology_scheduler_recovery_duration_seconds",
    "topology_scheduler_domain_fragmentation_ratio",
    "gpuledger_placement_conflicts",
    "gpuledger_device_disagreements",
    "gpuledger_prefetch_total",
    "gpuledger_prefetch_held",
    "gpuledger_pod_shapes_total",
    "gpuledger_pods_waiting",
    "gpuledger_pod_oldest_wait_seconds",
    "gpuledger_pod_wait_seconds",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
PROMQL_WORDS = {
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "topk",
    "bottomk",
    "clamp_min",
    "clamp_max",
    "abs",
    "delta",
    "deriv",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "offset",
    "bool",
    "le",
    "quantile",
    "vector",
    "scalar",
    "time",
}


def known_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, label names), from the webhook's own registry when gpuledger/webhook/metrics.py
    exists."""
    try:
        from prometheus_client.metrics import MetricWrapperBase

        from gpuledger.webhook.metrics import WebhookMetrics
    except ImportError:
        return dict.fromkeys(EXPORTED_METRICS, ("unknown", ()))
    found = {}
    for collector in vars(WebhookMetrics()).values():
        if isinstance(collector, MetricWrapperBase):
            for family in collector.describe():
                name = family.name + ("_total" if family.type == "counter" else "")
                found[name] = (family.type, tuple(getattr(collector, "_labelnames", ())))
    return found


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside label matchers, ranges and by()/without()."""
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring)\s*\([^)]*\)|\"[^\"]*\"", " ", expr)
    words = set(re.findall(r"(?<![\w.])[a-zA-Z_:][\w:]*", stripped))
    return {w for w in words if w not in PROMQL_WORDS}


def dashboard() -> dict:
    cm = one(render(OVERLAYS["prod"]), "ConfigMap", "gpuledger-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    return json.loads(text)


def test_dashboard_queries_only_exported_metrics_and_covers_them():
    metrics = known_metrics()
    assert set(metrics) == EXPORTED_METRICS  # the agreed list and the webhook agree
    used: set[str] = set()
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        labels: set[str] = set()
        for name in names:
            base = next(
                (
                    name[: -len(s)]
                    for s in HISTOGRAM_SUFFIXES
                    if name.endswith(s) and name[: -len(s)] in metrics
                ),
                name,
            )
            assert base in metrics, f"{name!r} in {expr!r} is not an exported metric"
            kind, label_names = metrics[base]
            if base != name:
                assert kind in ("histogram", "unknown"), f"{name}: {base} is a {kind}"
                labels.add("le")
            labels.update(label_names)
            used.add(base)
        for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in filter(None, (g.strip() for g in grouping.split(","))):
                assert label in labels or metrics[base][0] == "unknown", (
                    f"{label!r} is no label of {names} in {expr!r}"
                )
    assert used == set(metrics), f"metrics with no panel: {sorted(set(metrics) - used)}"


def test_dashboard_panels_use_the_datasource_variable():
    dash = dashboard()
    assert any(v["name"] == "datasource" and v["type"] == "datasource" for v in dash["templating"]["list"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"


def test_service_monitor_scrapes_the_metrics_port():
    docs = render(OVERLAYS["prod"])
    monitor = one(docs, "ServiceMonitor")
    services = [
        s for s in objects(docs, "Service") if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in services] == ["gpuledger"]
    assert services[0]["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]
    port_names = {p["name"] for p in services[0]["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    # scraped over the webhook's TLS, verified with the CA from the Secret the pods serve from
    assert endpoint["scheme"] == "https"
    tls_volume = next(
        v for v in webhook_deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
    )
    assert endpoint["tlsConfig"]["ca"]["secret"] == {
        "name": tls_volume["secret"]["secretName"],
        "key": "ca.crt",
    }
    service = services[0]["metadata"]
    assert endpoint["tlsConfig"]["serverName"] in pki.service_dns_names(service["name"], service["namespace"])
    assert not objects(render(OVERLAYS["dev"]), "ServiceMonitor")  # dev needs no Prometheus operator


def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(a_b_bucket{x="y"}[5m])))') == {
        "a_b_bucket"
    }
    assert metric_names("sum(x_total) / on(leaf) group_left y_ratio offset 5m") == {"x_total", "y_ratio"}


# ------------------------------------------------------------------------------------ docs/deployment.md
def test_deployment_guide_names_what_exists():
    """The guide's modes, object names and CLI flags are the real ones (drift fails here, not in an
    outage)."""
    from gpuledger.certs import cli as certs_cli

    text = (REPO / "docs" / "deployment.md").read_text()
    config = pytest.importorskip("gpuledger.webhook.config")
    model = pytest.importorskip("gpuledger.core.model")
    for mode in config.VISIBILITY_MODES:
        assert f"`{mode}`" in text
    for mode in model.BindingMode:
        assert f"`{mode.value}`" in text
    docs = render(BASE)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config_obj = one(docs, kind)
        assert f"{kind.lower()} {config_obj['metadata']['name']}" in text
        assert config_obj["webhooks"][0]["name"] in text
    subparsers = next(a for a in certs_cli._parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for action, parser in subparsers.choices.items():
        known = {o for a in parser._actions for o in a.option_strings}
        for line in re.findall(rf"gpuledger certs {action}[^\n`]*", text):
            for option in re.findall(r"--[a-z-]+", line):
                assert option in known, f"{option} in {line!r}"
    assert "gpuledger.io/admission=enabled" in text
    selector = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchLabels"]
    assert selector == {"gpuledger.io/admission": "enabled"}


def test_ray_commands_use_options_the_installed_ray_accepts():
    """`ray start`/`ray stop` lines and rayStartParams checked against the Ray CLI the image installs (same
    version as the venv: see test_ray_version_matches_the_image), and the shell script parses."""
    scripts = pytest.importorskip("ray.scripts.scripts")
    start_opts = {o for p in scripts.start.params for o in p.opts}
    stop_opts = {o for p in scripts.stop.params for o in p.opts}
    docs = render(OVERLAYS["prod"])
    container = webhook_container(docs)
    script = container_argv(container)[2]
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    pre_stop = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    lines = shell_lines(container) + [
        shlex.split(part) for part in re.split(r"[;&|]+", pre_stop.split("-c", 1)[1])
    ]
    checked = 0
    for tokens in lines:
        if tokens[:2] in (["ray", "start"], ["ray", "stop"]):
            known = start_opts if tokens[1] == "start" else stop_opts
            for token in tokens[2:]:
                if token.startswith("-"):
                    assert token.split("=", 1)[0] in known, f"ray {tokens[1]}: unknown option {token}"
            checked += 1
    assert checked == 2
    rc = one(docs, "RayCluster")["spec"]
    for group in [rc["headGroupSpec"], *rc["workerGroupSpecs"]]:
        for key in group["rayStartParams"]:
            assert f"--{key}" in start_opts, key


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_node_agent_is_confined_to_what_it_reads(path):
    """The agent needs the kubelet's PodResources socket, the host's pids and the host's sysfs (its network
    links' speeds), nothing more: no capabilities, no privilege, no writable root, the socket's folder and
    sysfs read-only, in a namespace of its own."""
    docs = render(path)
    agents = [d for d in objects(docs, "DaemonSet") if d["metadata"]["name"] == "gpuledger-node-agent"]
    if not agents:
        return
    (ds,) = agents
    (ns,) = [d for d in objects(docs, "Namespace") if d["metadata"]["name"] == AGENT_NAMESPACE]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    spec = ds["spec"]["template"]["spec"]
    assert spec.get("hostPID") is True and not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc.get("privileged") in (None, False)
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"pod-resources": "/var/lib/kubelet/pod-resources", "host-sys": "/sys"}
    for name in host_paths:
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == name]
        assert mount["readOnly"] is True
