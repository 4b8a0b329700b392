"""CLI test fixtures: run `gpuledger ...` in-process and capture its real output; install the GPUWorkload and
GPUNode CRDs (the operator's from manifests/crds/ when present, else the stand-ins in fixtures/crds.yaml).

The e2e fixtures (`stack`, `gpu_nodes`) are the end-to-end suite's own, re-exported here.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuledger.cli.main import main as gpuledger_main
from tests.e2e.conftest import gpu_nodes, stack  # noqa: F401 - pytest fixtures, used by name

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "manifests" / "crds"
STAND_IN_CRDS = Path(__file__).parent / "fixtures" / "crds.yaml"


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)

    def table(self) -> list[dict[str, str]]:
        """The first table in the output as rows of {HEADER: cell}, split on the header's column starts."""
        lines = self.out.splitlines()
        header = next(i for i, line in enumerate(lines) if line.split() and line.split()[0].isupper())
        return parse_table(lines[header:])


def parse_table(lines: list[str]) -> list[dict[str, str]]:
    """kubectl-style columns: each starts where its header starts; a row ends at the first blank line."""
    head = lines[0]
    starts = [i for i, c in enumerate(head) if c != " " and (i == 0 or head[i - 1] == " ")]
    names = head.split()
    rows = []
    for line in lines[1:]:
        if not line.strip():
            break
        cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def run_cli(*args: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = gpuledger_main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(apiserver):
    """`cli("nodes", "-o", "json")` runs gpuledger as the cluster admin against the test control plane."""

    def run(*args: str) -> Result:
        return run_cli(args[0], "--kubeconfig", apiserver.kubeconfig, *args[1:])

    return run


def crd_documents() -> list[dict]:
    files = sorted(CRD_DIR.glob("*.yaml")) if CRD_DIR.is_dir() else [STAND_IN_CRDS]
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    return [d for d in docs if d.get("kind") == "CustomResourceDefinition"]


@pytest.fixture(scope="session")
def gpu_crds(apiserver):
    """GPUWorkload (both groups) and GPUNode served by the control plane."""
    docs = crd_documents()
    apiserver.apply(docs)
    for d in docs:
        apiserver.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{d['metadata']['name']}"
        )
    return docs
