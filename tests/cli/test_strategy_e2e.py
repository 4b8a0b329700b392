"""`gpuledger strategy` against the real kube-apiserver and ledger: it shows and patches the webhook's
ConfigMap (found through the Deployment that mounts it), and the webhook's config reload takes the change to
the live ledger."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.config_watch import ConfigWatcher

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def installed_config(apiserver):
    """A gpuledger-system-like namespace with the webhook's ConfigMap (hashed name) and Deployment."""
    system = apiserver.create_namespace(f"t-sys-{uuid.uuid4().hex[:5]}", admission=False, users=())
    cm_name = "gpuledger-config-5t2h8m9g4k"
    text = (REPO / "manifests" / "config" / "config.yaml").read_text()
    deployment = yaml.safe_load((REPO / "manifests" / "deployment.yaml").read_text())
    deployment["metadata"]["namespace"] = system
    deployment["spec"]["replicas"] = 0  # only its volumes are read
    for v in deployment["spec"]["template"]["spec"]["volumes"]:
        if v["name"] == "config":
            v["configMap"]["name"] = cm_name
    apiserver.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": cm_name, "namespace": system},
                "data": {"config.yaml": text},
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "gpuledger-config-zzzzzzzzzz", "namespace": system},
                "data": {"config.yaml": "default_strategy: random\n"},
            },  # not the one mounted
            deployment,
        ]
    )
    yield system, cm_name
    apiserver.kubectl("delete", "namespace", system, "--wait=false")


def test_strategy_shows_and_changes_the_live_default(apiserver, stack, installed_config, cli, tmp_path):
    system, cm_name = installed_config
    shown = cli("strategy", "--system-namespace", system, "-o", "json")
    assert shown.code == 0, shown.err
    data = shown.json()
    assert data["effective"] == "fgd_host" and data["configMap"] == f"{system}/{cm_name}"
    assert "priority" in data["available"]
    status = cli("status", "--system-namespace", system, "--source", "nodes", "-o", "json").json()
    assert status["strategy"]["effective"] == "fgd_host"
    (row,) = cli("strategy", "--system-namespace", system).table()
    assert row["STRATEGY"] == "fgd_host" and cm_name in row["SOURCE"]

    changed = cli("strategy", "leastLoaded", "--system-namespace", system)
    assert changed.code == 0, changed.err
    assert "fgd_host -> least_utilized" in changed.out
    text = apiserver.get_json("configmap", cm_name, "-n", system)["data"]["config.yaml"]
    before = (REPO / "manifests" / "config" / "config.yaml").read_text()
    assert (
        text.replace("default_strategy: least_utilized", "default_strategy: fgd_host") == before
    )  # comments kept

    # the webhook's reload takes the file from there: the mounted file, loaded and pushed to the live ledger
    mounted = tmp_path / "config.yaml"
    mounted.write_text(text)
    watcher = ConfigWatcher(
        mounted,
        lambda: WebhookConfig.from_file(mounted).with_environment({}),
        lambda settings, who: _push(stack, settings, who),
    )
    try:
        assert asyncio_run(watcher.check(0.0))
        assert stack.call("get_settings")["default_strategy"] == "least_utilized"
    finally:
        stack.call("set_default_strategy", "fgd_host", "tests/cli restore")


async def _push(stack, settings, who):
    return stack.call("apply_config", settings, who)


def asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


def test_strategy_rejects_an_unknown_name_and_a_missing_install(installed_config, cli):
    system, _ = installed_config
    bad = cli("strategy", "fastest", "--system-namespace", system)
    assert bad.code == 2 and "fastest" in bad.err and "best_fit" in bad.err
    missing = cli("strategy", "--system-namespace", "no-such-namespace")
    assert missing.code == 4 and "no gpuledger ConfigMap" in missing.err


def test_status_names_the_ledgers_default_without_a_config_map(apiserver, stack, cli):
    """The dev cluster's ledger runs with no gpuledger ConfigMap: `status` names the default it uses."""
    system = apiserver.create_namespace(f"t-sys-{uuid.uuid4().hex[:5]}", admission=False, users=())
    try:
        live = stack.call("get_settings")["default_strategy"]
        data = cli("status", "--system-namespace", system, "--source", "nodes", "-o", "json").json()
        assert data["strategy"]["effective"] == live and data["strategy"]["configMap"] is None
        text = cli("status", "--system-namespace", system, "--source", "nodes")
        assert text.code == 0, text.err
        assert text.out.splitlines()[-1] == (
            f"default strategy: {live} (built-in default: no gpuledger ConfigMap in {system} sets another)"
        )
    finally:
        apiserver.kubectl("delete", "namespace", system, "--wait=false")
