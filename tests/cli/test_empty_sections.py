"""What the commands print for a cluster with nothing in a section, and the default strategy `status` names
when no ConfigMap sets it: against a stand-in for the API (a Kube answering lists), no cluster needed.

An empty section is one line (`PODS WAITING FOR GPUS none`), never a title or `none` followed by a header.
"""

from __future__ import annotations

import pytest

from gpuledger.cli import common, strategy
from gpuledger.cli.kube import KubeError
from gpuledger.webhook.config import WebhookConfig
from tests.cli.conftest import run_cli


class EmptyCluster:
    """The Kube calls the read-only commands make, each answering nothing (or what a test sets)."""

    namespace = "default"

    def __init__(self, objects: dict | None = None, forbidden: bool = False):
        self.objects = objects or {}  # (kind, name, namespace) -> object
        self.forbidden = forbidden

    def _check(self) -> None:
        if self.forbidden:
            raise KubeError(403, 'configmaps is forbidden: User "viewer" cannot list resource "configmaps"')

    def read(self, api_version: str, kind: str, name: str, namespace: str) -> dict | None:
        self._check()
        return self.objects.get((kind, name, namespace))

    def config_maps(self, namespace: str) -> list[dict]:
        self._check()
        return [o for (k, _, ns), o in self.objects.items() if k == "ConfigMap" and ns == namespace]

    def pods(self, namespace: str | None = None) -> list[dict]:
        return []

    def nodes(self) -> list[dict]:
        return []

    def gpu_nodes(self) -> list[dict]:
        return []

    def gpu_workloads(self, namespace: str | None = None) -> list[dict]:
        return []

    def gpu_queues(self) -> list[dict]:
        return []

    def namespaces(self) -> list[dict]:
        return []

    def resource_slices(self) -> list[dict]:
        return []


@pytest.fixture
def cluster(monkeypatch):
    """Every command connects to an EmptyCluster (the test may replace `box[0]`)."""
    box = [EmptyCluster()]
    monkeypatch.setattr(common, "connect", lambda args: box[0])
    return box


def blocks(text: str) -> list[list[str]]:
    """The output's sections: runs of lines between blank lines."""
    out: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [b for b in out if b]


def assert_no_bare_header(text: str) -> None:
    for block in blocks(text):
        if any(line.endswith(" none") for line in block):
            assert len(block) == 1, f"an empty section followed by more lines:\n{text}"
        last = block[-1].split()
        # a header is the last line only when its table has no row
        assert not (len(block) > 1 and len(last) > 2 and all(w.isupper() for w in last)), text


def test_an_empty_table_is_one_line_and_no_header():
    empty = common.render_text(common.table(["a", "b"], [], title="THINGS 0", empty="THINGS none"))
    assert empty == "THINGS none\n"
    assert common.render_text(common.table(["a", "b"], [], title="QUOTAS")) == "QUOTAS none\n"
    full = common.render_text(common.table(["a", "b"], [[1, 2]], title="THINGS 1"))
    assert full.splitlines()[:2] == ["THINGS 1", "A   B"]


def test_status_on_an_empty_cluster(cluster):
    result = run_cli("status")
    assert result.code == 0, result.err
    sections = blocks(result.out)
    assert sections[1:] == [
        ["GPUWORKLOADS none"],
        ["PODS WAITING FOR GPUS none"],
        [
            "default strategy: fgd_host (built-in default: no gpuledger ConfigMap in gpuledger-system sets "
            "another)"
        ],
    ]
    assert sections[0][-1].split()[0] == "TOTAL"  # the totals always have their TOTAL row
    assert_no_bare_header(result.out)


@pytest.mark.parametrize(
    "argv",
    [
        ("queues",),
        ("nodes",),
        ("workloads",),
        ("workloads", "-A"),
        ("watch", "--count", "1", "--interval", "0", "--devices"),
        ("health",),
    ],
)
def test_every_command_prints_an_empty_section_as_one_line(cluster, argv):
    result = run_cli(*argv)
    assert result.code == 0, result.err
    assert_no_bare_header(result.out)


def test_the_lines_each_empty_section_prints(cluster):
    assert run_cli("nodes").out == "GPU DEVICES none\n"
    assert run_cli("workloads").out == "GPUWORKLOADS AND PLACED PODS none\n"
    assert run_cli("health").out == "all 0 GPUs on 0 nodes healthy and reporting\n"
    queues = blocks(run_cli("queues").out)
    assert queues[-1] == ["PODS WAITING FOR GPUS none"]
    watch = blocks(run_cli("watch", "--count", "1", "--interval", "0").out)
    assert ["PODS WAITING FOR GPUS none"] in watch and ["GPUWORKLOADS AND PLACED PODS none"] in watch


def test_a_section_with_rows_keeps_its_title_and_header(cluster):
    from datetime import UTC, datetime

    from gpuledger.cli.status import queue_table
    from gpuledger.views.workloads import WorkloadRow

    running = WorkloadRow(kind="GPUWorkload", namespace="ml", name="a", phase="Running")
    # the title counts every phase; with none Queued the section is that line alone
    text = common.render_text(queue_table([running], datetime.now(UTC)))
    assert text == "GPUWORKLOADS Running=1\n"


# ------------------------------------------------------------------------------------- default strategy
def deployment(env: dict[str, str] | None = None, config_map: str | None = None) -> dict:
    spec: dict = {
        "containers": [{"name": "webhook", "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}]
    }
    if config_map:
        spec["volumes"] = [{"name": "config", "configMap": {"name": config_map}}]
    return {"spec": {"template": {"spec": spec}}}


def config_map(name: str, text: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "gpuledger-system",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "data": {"config.yaml": text},
    }


def test_the_built_in_default_is_the_webhooks_and_the_ledgers():
    from gpuledger.service.settings import LedgerSettings

    assert strategy.BUILTIN_DEFAULT == WebhookConfig().default_strategy == LedgerSettings().default_strategy


def test_without_a_config_map_the_ledger_uses_the_built_in_default():
    found = strategy.live_default(EmptyCluster(), None)
    assert found["effective"] == WebhookConfig().default_strategy
    assert found["source"] == "built-in default: no gpuledger ConfigMap in gpuledger-system sets another"
    assert found["configMap"] is None


def test_the_deployments_variable_wins_without_a_config_map_too():
    kube = EmptyCluster(
        {("Deployment", "gpuledger", "gpuledger-system"): deployment({"SCHEDULING_STRATEGY": "best_fit"})}
    )
    found = strategy.live_default(kube, None)
    assert (
        found["effective"] == "best_fit" and found["source"] == "SCHEDULING_STRATEGY on Deployment gpuledger"
    )


def test_a_config_map_sets_the_default():
    kube = EmptyCluster(
        {
            ("Deployment", "gpuledger", "gpuledger-system"): deployment(config_map="gpuledger-config-abc"),
            ("ConfigMap", "gpuledger-config-abc", "gpuledger-system"): config_map(
                "gpuledger-config-abc", "default_strategy: least_utilized\n"
            ),
        }
    )
    found = strategy.live_default(kube, None)
    assert found["effective"] == "least_utilized"
    assert found["source"] == "ConfigMap gpuledger-system/gpuledger-config-abc"


def test_status_says_unknown_only_when_the_config_is_not_readable(cluster):
    cluster[0] = EmptyCluster(forbidden=True)
    result = run_cli("status")
    assert result.code == 0, result.err
    last = result.out.splitlines()[-1]
    assert last.startswith(
        "default strategy: unknown (the gpuledger config in gpuledger-system is not readable"
    )
    assert "forbidden" in last
    assert run_cli("status", "-o", "json").json()["strategy"] is None
