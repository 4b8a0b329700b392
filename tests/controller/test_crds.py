"""The CRD files in manifests/crds/ are what gpuledger.controller.crds builds, and their schemas are
structural."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuledger.controller import crds

CRDS_DIR = Path(__file__).resolve().parents[2] / "manifests" / "crds"
CHART_CRDS_DIR = Path(__file__).resolve().parents[2] / "charts" / "gpuledger" / "files" / "crds"


@pytest.mark.parametrize("name", list(crds.CRD_FILES))
def test_file_is_generated(name):
    assert (CRDS_DIR / name).read_text() == crds.render(name), (
        "run: python -m gpuledger.controller.crds manifests/crds"
    )


@pytest.mark.parametrize("name", list(crds.CRD_FILES))
def test_the_charts_copy_is_generated(name):
    assert (CHART_CRDS_DIR / name).read_text() == crds.render(name), (
        "run: python -m gpuledger.controller.crds manifests/crds && cp manifests/crds/gpu*.yaml "
        "charts/gpuledger/files/crds/"
    )


def test_the_chart_holds_no_other_crd():
    assert sorted(p.name for p in CHART_CRDS_DIR.glob("*.yaml")) == sorted(crds.CRD_FILES)


def test_kustomization_lists_the_files():
    assert (CRDS_DIR / "kustomization.yaml").read_text() == crds.kustomization()


def test_names_scopes_and_status_fields():
    docs = {p.name: yaml.safe_load(p.read_text()) for p in CRDS_DIR.glob("gpu*.yaml")}
    names = {d["metadata"]["name"]: d["spec"] for d in docs.values()}
    assert names["gpuworkloads.agentaflow.io"]["scope"] == "Namespaced"
    assert names["gpuworkloads.agentaflow.io"]["names"]["shortNames"] == ["gw"]
    assert names["gpuworkloads.agentaflow.io"]["versions"][0]["name"] == "v1"
    assert names["gpuworkloads.gpu.warp.dev"]["versions"][0]["name"] == "v1alpha1"
    assert names["gpunodes.agentaflow.io"]["scope"] == "Cluster"
    for name in ("gpuworkloads.agentaflow.io", "gpuworkloads.gpu.warp.dev"):
        version = names[name]["versions"][0]
        assert version["subresources"] == {"status": {}}
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        for field in (
            "phase",
            "assignedNodes",
            "devices",
            "attempts",
            "nextRetryTime",
            "queuePosition",
            "reason",
            "message",
            "conditions",
        ):
            assert field in status, (name, field)
        assert status["phase"]["enum"] == list(crds.PHASES)
        assert {c["name"] for c in version["additionalPrinterColumns"]} >= {
            "Phase",
            "Position",
            "Nodes",
            "Age",
        }


def _walk(schema, path="$"):
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


@pytest.mark.parametrize("name", list(crds.CRD_FILES))
def test_schema_is_structural(name):
    """Every node has a type, unless it is int-or-string or keeps unknown fields (the apiserver's rule)."""
    version = crds.CRD_FILES[name]()["spec"]["versions"][0]
    for path, node in _walk(version["schema"]["openAPIV3Schema"]):
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), path
