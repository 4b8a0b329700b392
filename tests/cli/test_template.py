"""`gpuledger generate-template`: each template parses, the Pod and Job pass the Kubernetes schema, files are
never overwritten without --force, and the exit codes are the documented ones."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from gpuledger.cli.template import TEMPLATES, render
from tests.cli.conftest import run_cli


@pytest.mark.parametrize("kind", ["pod", "job"])
def test_pod_and_job_templates_pass_the_schema(kind):
    doc = yaml.safe_load(render(kind, "ml"))
    assert doc["metadata"]["namespace"] == "ml"
    for version in ("1.35.0", "1.36.0", "1.37.0"):  # the supported releases kubernetes-validate knows
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    ("kind", "group"), [("gpuworkload", "agentaflow.io/v1"), ("gpuworkload-warp", "gpu.warp.dev/v1alpha1")]
)
def test_gpuworkload_templates_carry_their_groups_fields(kind, group):
    doc = yaml.safe_load(render(kind))
    assert doc["apiVersion"] == group and doc["kind"] == "GPUWorkload"
    spec = doc["spec"]
    if group == "agentaflow.io/v1":
        assert spec["gpuRequirements"]["gpuCount"] == 1 and spec["podTemplate"]["spec"]["containers"]
    else:
        assert spec["gpuCount"] == 2 and spec["retryPolicy"] == {"maxRetries": 3, "backoffSeconds": 30}
    assert all(line.startswith("#") for line in TEMPLATES[kind].splitlines()[:1])


def test_writes_a_file_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "w.yaml"
    first = run_cli("generate-template", str(path), "--kind", "job")
    assert first.code == 0 and yaml.safe_load(path.read_text())["kind"] == "Job"
    again = run_cli("generate-template", str(path))
    assert again.code == 3 and "--force" in again.err
    forced = run_cli("generate-template", str(path), "--force")
    assert forced.code == 0 and yaml.safe_load(path.read_text())["kind"] == "GPUWorkload"
    assert run_cli("generate-template").out == render("gpuworkload")
    assert run_cli("generate-template", "--kind", "nope").code == 2
