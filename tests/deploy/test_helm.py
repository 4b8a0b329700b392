"""The Helm chart (charts/gpuledger) installs what the kustomize overlays install.

`helm template` with default values renders the same objects as `kustomize/overlays/prod`, compared parsed
and normalised: Helm's bookkeeping labels dropped, kustomize's ConfigMap name hash dropped, the settings file
and the dashboard compared as the data they hold. Other values are checked against the other overlays and
the webhook's own config loader. Helm is built from its Go module (charts/build_helm.sh, `make helm`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from gpuledger.webhook.config import WebhookConfig
from tests.deploy.test_manifests import OVERLAYS, render
from tests.parts import missing_part

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuledger"
NAMESPACE = "gpuledger-system"
HELM_VERSION = os.environ.get("HELM_VERSION", "3.22.0")
CACHE = Path(os.environ.get("GPULEDGER_CACHE", Path.home() / ".cache" / "gpuledger"))
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")
HASHED = re.compile(r"^(gpuledger-config)-[a-z0-9]{10}$")


def helm_binary() -> str | None:
    cached = CACHE / f"helm-v{HELM_VERSION}-release"
    return str(cached) if cached.exists() else shutil.which("helm")


def _require_helm() -> str:
    helm = helm_binary()
    if helm is None:
        message = "helm not built: run `make helm` (charts/build_helm.sh builds it from helm.sh/helm/v3)"
        missing_part(message)
    return helm


pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not on PATH")


def _template(sets: tuple[str, ...]) -> subprocess.CompletedProcess:
    """`helm template` of the chart with each `key=value` as a --set."""
    argv = [_require_helm(), "template", "gpuledger", str(CHART), "--namespace", NAMESPACE]
    for value in sets:
        argv += ["--set", value]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def helm_template(*sets: str) -> list[dict]:
    proc = _template(sets)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def helm_fails(*sets: str) -> str:
    proc = _template(sets)
    assert proc.returncode != 0, "helm template was expected to refuse these values"
    return proc.stderr


def normalise(docs) -> dict[tuple[str, str, str], dict]:
    """(kind, namespace, name) -> the object, minus what only says who rendered it."""
    text = json.dumps(list(docs))
    for name in {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}:
        match = HASHED.match(name)
        if match:
            text = text.replace(f'"{name}"', f'"{match.group(1)}"')
    out = {}
    for doc in json.loads(text):
        meta = doc["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in HELM_LABELS}
        if labels:
            meta["labels"] = labels
        else:
            meta.pop("labels", None)
        if doc["kind"] == "ConfigMap":
            doc["data"] = {
                k: (json.loads(v) if k.endswith(".json") else yaml.safe_load(v))
                for k, v in doc.get("data", {}).items()
            }
        out[(doc["kind"], meta.get("namespace", ""), meta["name"])] = doc
    return out


def test_default_values_render_the_prod_overlay():
    chart = normalise(helm_template())
    prod = normalise(render(OVERLAYS["prod"]))
    assert sorted(chart) == sorted(prod)
    for key, obj in prod.items():
        assert chart[key] == obj, f"{key} differs from kustomize/overlays/prod"


def test_the_dashboard_copy_is_the_kustomize_one():
    kustomize = REPO / "kustomize" / "components" / "monitoring" / "dashboards" / "gpuledger.json"
    assert (CHART / "files" / "gpuledger.json").read_bytes() == kustomize.read_bytes()


def test_every_object_carries_helms_labels():
    for doc in helm_template():
        labels = doc["metadata"].get("labels") or {}
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where


def test_cert_manager_mode_renders_the_cert_manager_overlay():
    chart = normalise(helm_template("tls.mode=cert-manager"))
    overlay = normalise(render(OVERLAYS["cert-manager"]))
    assert sorted(chart) == sorted(overlay)
    for key, obj in overlay.items():
        assert chart[key] == obj, f"{key} differs from kustomize/overlays/cert-manager"


def test_generate_mode_issues_a_certificate_the_webhooks_trust():
    docs = helm_template("tls.mode=generate")
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "gpuledger-tls"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert f"gpuledger.{NAMESPACE}.svc" in names
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (config,) = [d for d in docs if d["kind"] == kind]
        assert config["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    mounted = next(
        v
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpuledger"
        for v in d["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "tls"
    )
    assert mounted["secret"]["secretName"] == secret["metadata"]["name"]


def test_placement_key_secret_when_asked():
    assert not [d for d in helm_template() if d["kind"] == "Secret"]
    docs = helm_template("placementKey.create=true", "placementKey.value=s3cret")
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "gpuledger-placement-key"
    assert base64.b64decode(secret["data"]["key"]) == b"s3cret"
    (random,) = [d for d in helm_template("placementKey.create=true") if d["kind"] == "Secret"]
    assert len(base64.b64decode(random["data"]["key"])) == 64


def test_values_reach_the_settings_file_the_webhook_loads():
    docs = helm_template(
        "config.bindingMode=nodeName",
        "config.visibilityMode=runtime-uuids",
        "config.defaultStrategy=priority",
        "config.extra.fail_open=true",
    )
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpuledger-config"]
    config = WebhookConfig.from_document(yaml.safe_load(cm["data"]["config.yaml"]))
    assert (config.binding_mode.value, config.visibility_mode, config.default_strategy) == (
        "nodeName",
        "runtime-uuids",
        "priority",
    )


def test_embedded_ray_is_one_replica_like_the_dev_overlay():
    docs = helm_template("kuberay.enabled=false", "webhook.replicas=1")
    assert not [d for d in docs if d["kind"] == "RayCluster"]
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpuledger")
    dev = next(d for d in render(OVERLAYS["dev"]) if d["kind"] == "Deployment")
    container, dev_container = (x["spec"]["template"]["spec"]["containers"][0] for x in (deployment, dev))
    assert container["args"] == dev_container["args"]
    assert deployment["spec"]["strategy"] == dev["spec"]["strategy"]
    assert "replicas > 1 needs kuberay.enabled" in helm_fails("kuberay.enabled=false")


def test_optional_parts_switch_off():
    docs = helm_template(
        "nodeAgent.enabled=false",
        "monitoring.serviceMonitor=false",
        "monitoring.dashboard=false",
        "createNamespace=false",
    )
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"DaemonSet", "ServiceMonitor", "Namespace"}
    assert "gpuledger-dashboard" not in {d["metadata"]["name"] for d in docs}
    # values.schema.json names the value and what is accepted
    accepted = "value must be one of 'external', 'cert-manager', 'generate'"
    assert f"/tls/mode': {accepted}" in helm_fails("tls.mode=bogus")
    assert "/config/bindingMode" in helm_fails("config.bindingMode=node")
    assert "/nodeAgent/ignoreXids" in helm_fails("nodeAgent.ignoreXids=13;31")


def test_the_node_agents_ignored_xids_are_a_value():
    (ds,) = [d for d in helm_template("nodeAgent.ignoreXids=none") if d["kind"] == "DaemonSet"]
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--ignore-xids") + 1] == "none"
    # --set reads 31 as a number: the chart takes it too
    (one,) = [d for d in helm_template("nodeAgent.ignoreXids=31") if d["kind"] == "DaemonSet"]
    args = one["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--ignore-xids") + 1] == "31"


def test_the_controllers_probe_port_is_a_value():
    """controller.healthPort reaches --liveness-port, the named port and so every probe of the container."""
    from gpuledger.controller.main import build_parser

    (deployment,) = [
        d
        for d in helm_template("controller.healthPort=9091")
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpuledger"
    ]
    container = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "controller"
    )
    assert build_parser().parse_args(container["args"][2:]).liveness_port == 9091
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert ports[container[probe]["httpGet"]["port"]] == 9091
    assert "must differ" in helm_fails("controller.healthPort=8080")
    assert "/controller/healthPort" in helm_fails("controller.healthPort=0")


@pytest.mark.parametrize("version", ["1.35.0", "1.36.3", "1.37.2", "1.38.0-beta.0"])
def test_the_chart_installs_on_each_supported_kubernetes(version):
    proc = subprocess.run(
        [_require_helm(), "template", "gpuledger", str(CHART), "--kube-version", version],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_chart_refuses_a_kubernetes_older_than_it_supports():
    """Chart.yaml's kubeVersion: 1.34 and older are end-of-life and untested (docs/deployment.md)."""
    proc = subprocess.run(
        [_require_helm(), "template", "gpuledger", str(CHART), "--kube-version", "1.34.9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert ">=1.35.0-0" in proc.stderr, proc.stderr


def test_helm_template_assumes_the_kubernetes_of_its_client_go():
    """Built as helm's release build is (charts/build_helm.sh), `helm template` with no --kube-version renders
    the chart rather than assuming v1.20.0 and refusing its kubeVersion."""
    assert helm_template()
