"""The webhook's config file: gpuledger's keys and the topology scheduler's SchedulerConfig as written, the
SCHEDULING_STRATEGY override, validation that names key, value and what is accepted, and the reload that
pushes a changed file's settings to the live ledger (time is the test's, nothing sleeps)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import yaml

from gpuledger.core.model import Placement, Request
from gpuledger.service.ledger_service import AdmitCall, LedgerService
from gpuledger.service.settings import LedgerSettings
from gpuledger.webhook.admission.handler import AdmissionHandler
from gpuledger.webhook.admission.owners import StaticOwners
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.config_watch import ConfigWatcher
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.serve import build_parser, load_config
from tests.webhook.webhook_support import Clock, cluster, config, gpu_pod, review

ROOT = Path(__file__).resolve().parents[2]
NOW = 1000.0

# the topology scheduler's ConfigMap, exactly as its doc writes it (docs: "Configuration")
TOPOLOGY_SCHEDULER_CONFIG = """\
apiVersion: topology.scheduler/v1alpha1
kind: SchedulerConfig
metadata:
  name: topology-scheduler-config
spec:
  scoringWeights:
    resourceAvailability: 0.4
    topologyAlignment: 0.3
    domainUtilization: 0.2
    historicalPerformance: 0.1
  topologyConstraints:
    maxNodesPerLeaf: 4
    maxGPUsPerLeaf: 32
"""


def write(path: Path, text: str) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # an atomic swap, as a ConfigMap mount changes
    return path


# ------------------------------------------------------------------------------------------- formats
def test_gpuledger_keys_reach_the_ledger_config_and_settings(tmp_path):
    path = write(
        tmp_path / "c.yaml",
        yaml.safe_dump(
            {
                "defaultStrategy": "leastLoaded",
                "scoringWeights": {"resource_availability": 0.7, "topologyAlignment": 0.3},
                "topologyConstraints": {"maxNodesPerLeaf": 2, "maxGPUsPerLeaf": 16},
                "leafLabel": "example.com/rack",
                "spine_label": "example.com/row",
            }
        ),
    )
    cfg = WebhookConfig.from_file(path)
    weights = {
        "resourceAvailability": 0.7,
        "topologyAlignment": 0.3,
        "domainUtilization": 0.0,
        "historicalPerformance": 0.0,
    }  # a weight left out counts 0
    assert cfg.default_strategy == "least_utilized"  # the registered name of the alias
    assert cfg.topology_constraints == {"max_nodes_per_leaf": 2, "max_gpus_per_leaf": 16}
    ledger = cfg.ledger_config()
    assert (ledger.default_strategy, ledger.balanced_weights, ledger.leaf_label, ledger.spine_label) == (
        "least_utilized",
        weights,
        "example.com/rack",
        "example.com/row",
    )
    assert cfg.ledger_settings() == LedgerSettings(
        default_strategy="least_utilized",
        scoring_weights=weights,
        max_nodes_per_leaf=2,
        max_gpus_per_leaf=16,
        leaf_label="example.com/rack",
        spine_label="example.com/row",
    )


def test_the_topology_scheduler_config_map_is_accepted_as_written(tmp_path):
    cfg = WebhookConfig.from_file(write(tmp_path / "topology.yaml", TOPOLOGY_SCHEDULER_CONFIG))
    assert cfg.scoring_weights == {
        "resourceAvailability": 0.4,
        "topologyAlignment": 0.3,
        "domainUtilization": 0.2,
        "historicalPerformance": 0.1,
    }
    assert cfg.topology_constraints == {"max_nodes_per_leaf": 4, "max_gpus_per_leaf": 32}
    assert cfg.default_strategy == "fgd_host"  # everything else keeps its default
    # the other spelling of its kind (the doc shows both)
    other = TOPOLOGY_SCHEDULER_CONFIG.replace("kind: SchedulerConfig", "kind: TopologySchedulerConfig")
    assert (
        WebhookConfig.from_file(write(tmp_path / "t2.yaml", other)).topology_constraints["max_gpus_per_leaf"]
        == 32
    )


def test_a_config_map_dump_holding_either_format_is_accepted(tmp_path):
    # `kubectl get configmap -n kube-system topology-scheduler-config -o yaml`: the settings under one
    # data key
    dump = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "topology-scheduler-config", "namespace": "kube-system"},
        "data": {"scheduler-config.yaml": TOPOLOGY_SCHEDULER_CONFIG},
    }
    cfg = WebhookConfig.from_file(write(tmp_path / "cm.yaml", yaml.safe_dump(dump)))
    assert cfg.topology_constraints == {"max_nodes_per_leaf": 4, "max_gpus_per_leaf": 32}
    dump["data"] = {"config.yaml": "default_strategy: priority\n", "README": "not settings"}
    assert (
        WebhookConfig.from_file(write(tmp_path / "cm.yaml", yaml.safe_dump(dump))).default_strategy
        == "priority"
    )
    dump["data"] = {"a.yaml": "{}", "b.yaml": "{}"}
    with pytest.raises(ValueError, match=r"data keys a.yaml, b.yaml are not accepted: expected one entry"):
        WebhookConfig.from_file(write(tmp_path / "cm.yaml", yaml.safe_dump(dump)))


def test_the_deployed_config_loads_with_the_default_ledger_settings():
    cfg = WebhookConfig.from_file(ROOT / "manifests" / "config" / "config.yaml")
    assert cfg.ledger_settings() == LedgerSettings()
    assert (cfg.leaf_label, cfg.spine_label) == ("topology.scheduler/leaf", "topology.scheduler/spine")


# ------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"default_strategy": "fastest"},
            r"default_strategy='fastest' is not accepted: "
            r"expected one of balanced, best_fit, .*priority.*round_robin",
        ),
        (
            {"scoring_weights": {"speed": 1}},
            r"scoring_weights.speed=1 is not accepted: 'speed' is no scoring weight; "
            r"expected one of resourceAvailability, "
            r"topologyAlignment, domainUtilization, historicalPerformance",
        ),
        (
            {"scoring_weights": {"topologyAlignment": -0.5}},
            r"scoring_weights.topologyAlignment=-0.5 is not accepted: expected a number >= 0",
        ),
        (
            {"scoring_weights": {"topologyAlignment": "high"}},
            r"scoring_weights.topologyAlignment='high' is not accepted: expected a number >= 0",
        ),
        ({"scoring_weights": {"topologyAlignment": 0}}, r"expected at least one weight above 0"),
        (
            {"scoring_weights": [0.4, 0.6]},
            r"scoring_weights=\[0.4, 0.6\] is not accepted: expected a mapping",
        ),
        (
            {"topology_constraints": {"maxNodesPerLeaf": -1}},
            r"topology_constraints.maxNodesPerLeaf=-1 is not accepted: "
            r"expected an integer from 0 \(no limit\)",
        ),
        (
            {"topology_constraints": {"maxGPUsPerLeaf": "32"}},
            r"topology_constraints.maxGPUsPerLeaf='32' is not accepted",
        ),
        (
            {"topology_constraints": {"maxLeaves": 2}},
            r"topology_constraints.maxLeaves=2 is not accepted: "
            r"expected one of maxNodesPerLeaf, maxGPUsPerLeaf",
        ),
        (
            {"sync_lease_term_s": 0},
            r"sync_lease_term_s 0: expected seconds, more than 0 and at most 600",
        ),
        (
            {"syncLeaseTermS": "30s"},
            r"sync_lease_term_s '30s': expected seconds, more than 0 and at most 600",
        ),
        (
            {"leaf_label": "not a label!"},
            r"leaf_label='not a label!' is not accepted: expected a Kubernetes label key",
        ),
        (
            {"leaf_label": "rack", "spine_label": "rack"},
            r"leaf_label='rack' is not accepted: expected a label key other than spine_label \('rack'\)",
        ),
    ],
)
def test_bad_values_name_the_key_the_value_and_what_is_accepted(values, message):
    with pytest.raises(ValueError, match=message):
        WebhookConfig.from_mapping(values)


def test_scheduler_config_shape_errors(tmp_path):
    bad_kind = TOPOLOGY_SCHEDULER_CONFIG.replace("kind: SchedulerConfig", "kind: Scheduler")
    with pytest.raises(
        ValueError,
        match=r"kind='Scheduler' is not accepted: expected one of SchedulerConfig, "
        r"TopologySchedulerConfig",
    ):
        WebhookConfig.from_file(write(tmp_path / "a.yaml", bad_kind))
    unknown = TOPOLOGY_SCHEDULER_CONFIG + "  preemption: true\n"
    with pytest.raises(ValueError, match=r"unknown webhook config keys: preemption"):
        WebhookConfig.from_file(write(tmp_path / "b.yaml", unknown))
    with pytest.raises(ValueError, match=r"expected a YAML mapping"):
        WebhookConfig.from_file(write(tmp_path / "c.yaml", "- a list\n"))
    with pytest.raises(ValueError, match=r"default_strategy is already set"):
        WebhookConfig.from_mapping({"default_strategy": "random", "defaultStrategy": "priority"})


# ---------------------------------------------------------------------------------------- SCHEDULING_STRATEGY
def args_for(path: Path | None = None):
    argv = ["--tls-cert", "c", "--tls-key", "k"] + (["--config", str(path)] if path else [])
    return build_parser().parse_args(argv)


def test_scheduling_strategy_overrides_the_file(tmp_path):
    path = write(tmp_path / "c.yaml", "default_strategy: best_fit\nfail_open: true\n")
    assert load_config(args_for(path), {}).default_strategy == "best_fit"
    cfg = load_config(args_for(path), {"SCHEDULING_STRATEGY": "priority"})
    assert (cfg.default_strategy, cfg.fail_open) == ("priority", True)
    assert cfg.ledger_settings().default_strategy == "priority"
    assert (
        load_config(args_for(), {"SCHEDULING_STRATEGY": " "}).default_strategy == "fgd_host"
    )  # empty: unset (the built-in default)
    with pytest.raises(
        ValueError, match=r"SCHEDULING_STRATEGY='fastest' is not accepted: expected one of .*priority"
    ):
        load_config(args_for(path), {"SCHEDULING_STRATEGY": "fastest"})


# ------------------------------------------------------------------------------------------- reload
class Pushes:
    """Pushes to an in-process LedgerService (what the Ray actor's `apply_config` runs), at the test's
    time."""

    def __init__(self, service: LedgerService):
        self.service, self.now, self.calls, self.fail = service, NOW, 0, False

    async def __call__(self, settings: LedgerSettings, who: str) -> dict:
        self.calls += 1
        if self.fail:
            raise ConnectionError("ledger restarting")
        return self.service.apply_config(settings, who, self.now)


def watcher_for(path: Path, service: LedgerService, environ: dict | None = None, **kwargs):
    push = Pushes(service)
    watcher = ConfigWatcher(
        path,
        lambda: load_config(args_for(path), environ or {}),
        push,
        source="replica-a",
        repush_interval_s=30.0,
        **kwargs,
    )
    return watcher, push


def admit_one(service: LedgerService, rid: str) -> Placement:
    [p] = service.admit([AdmitCall(Request(id=rid, gpus=1))], NOW)
    assert isinstance(p, Placement)
    return p


def test_a_changed_file_reaches_the_live_ledger(tmp_path, caplog):
    path = write(tmp_path / "config.yaml", "default_strategy: fgd_host\n")
    service = LedgerService(config().ledger_config(), {"kind": "objects", "objects": cluster(4, 8)}, now=NOW)
    watcher, push = watcher_for(path, service)
    run = asyncio.run
    assert run(watcher.check(0.0)) is False  # the first push: the ledger already has these settings
    assert push.calls == 1 and watcher.last_answer["applied"] is False
    assert admit_one(service, "a").strategy == "fgd_host"
    assert run(watcher.check(1.0)) is False and push.calls == 1  # unchanged file, re-push not due

    write(
        path,
        "default_strategy: priority\nscoring_weights: {topologyAlignment: 1}\n"
        "topology_constraints: {maxNodesPerLeaf: 2}\n",
    )
    push.now = NOW + 5
    with caplog.at_level(logging.INFO, logger="gpuledger.service"):
        assert run(watcher.check(2.0)) is True
    assert admit_one(service, "b").strategy == "priority"  # the next decision uses it
    settings = service.get_settings()
    assert settings["default_strategy"] == "priority" and settings["max_nodes_per_leaf"] == 2
    assert service.ledger.config.balanced_weights["topologyAlignment"] == 1.0
    assert settings["changed_at"] == NOW + 5 and settings["changed_by"].startswith(
        f"config file {path} (sha256 "
    )
    assert settings["changed_by"].endswith("via replica-a")
    assert settings["history"][-1]["changes"]["default_strategy"] == ["fgd_host", "priority"]
    assert "default_strategy 'fgd_host' -> 'priority'" in caplog.text
    assert service.stats().settings["default_strategy"] == "priority"  # shown in the stats the webhook polls
    assert service.status()["settings_changed_by"] == settings["changed_by"]
    assert watcher.reloads == 1


def test_a_bad_file_keeps_the_current_settings_until_it_is_fixed(tmp_path, caplog):
    path = write(tmp_path / "config.yaml", "default_strategy: random\n")
    service = LedgerService(config().ledger_config(), {"kind": "objects", "objects": cluster(2, 8)}, now=NOW)
    watcher, push = watcher_for(path, service)
    assert asyncio.run(watcher.check(0.0)) is True and service.settings.default_strategy == "random"
    write(path, "default_strategy: fastest\n")
    with caplog.at_level(logging.ERROR, logger="gpuledger.config"):
        assert asyncio.run(watcher.check(1.0)) is False
        assert asyncio.run(watcher.check(2.0)) is False
    assert watcher.failed_reloads == 1  # reported once, not at every poll
    assert "default_strategy='fastest' is not accepted" in caplog.text
    assert service.settings.default_strategy == "random"
    write(path, "default_strategy: round_robin\n")
    assert asyncio.run(watcher.check(3.0)) is True and service.settings.default_strategy == "round_robin"


def test_a_runtime_change_survives_re_pushes_and_a_restarted_ledger_gets_the_config_back(tmp_path):
    path = write(tmp_path / "config.yaml", "default_strategy: least_utilized\n")
    service = LedgerService(config().ledger_config(), {"kind": "objects", "objects": cluster(2, 8)}, now=NOW)
    watcher, push = watcher_for(path, service)
    assert asyncio.run(watcher.check(0.0)) is True
    service.set_default_strategy("priority", "alice", NOW + 1)  # `gpuledger strategy priority`
    assert asyncio.run(watcher.check(31.0)) is False and push.calls == 2  # the re-push leaves it alone
    assert service.settings.default_strategy == "priority" and service.changed_by == "alice"
    # the ledger restarted with its creator's settings; the next re-push puts the config's back
    restarted = LedgerService(
        config().ledger_config(), {"kind": "objects", "objects": cluster(2, 8)}, now=NOW
    )
    push.service = restarted
    push.fail = True
    assert asyncio.run(watcher.check(62.0)) is False and watcher.failed_pushes == 1
    push.fail = False
    assert asyncio.run(watcher.check(63.0)) is True  # a failed push is retried at the next poll
    assert restarted.settings.default_strategy == "least_utilized"


def test_restart_only_keys_are_reported_not_pretended(tmp_path, caplog):
    path = write(tmp_path / "config.yaml", "deadline_s: 2\n")
    service = LedgerService(config().ledger_config(), {"kind": "objects", "objects": cluster(2, 8)}, now=NOW)
    watcher, _ = watcher_for(path, service)
    asyncio.run(watcher.check(0.0))
    write(path, "deadline_s: 1\nfail_open: true\n")
    with caplog.at_level(logging.WARNING, logger="gpuledger.config"):
        asyncio.run(watcher.check(1.0))
    assert (
        "config keys deadline_s, fail_open changed" in caplog.text
        and "take effect when the webhook restarts" in caplog.text
    )


def test_configured_gang_limits_spread_a_gang_through_the_handler():
    """topology_constraints reach a real admission: a Job's 4 pods of 8 GPUs go 2 and 2 over two leaves."""

    def leaves(cfg):
        service = LedgerService(
            cfg.ledger_config(),
            {"kind": "objects", "objects": cluster(8, 8)},
            now=NOW,
            settings=cfg.ledger_settings(),
        )
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "train",
                "namespace": "default",
                "uid": "job-uid",
                "annotations": {"topology.scheduler/gang": "true"},
            },  # a gang only when asked
            "spec": {"parallelism": 4, "completions": 4},
        }
        handler = AdmissionHandler(cfg, InProcessLedgerClient(service, Clock(NOW)), StaticOwners([job]))
        pod = gpu_pod(
            8,
            name="train-0",
            ownerReferences=[
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": "job-uid",
                    "controller": True,
                }
            ],
        )
        decision = asyncio.run(handler.mutate(review(pod)))
        assert decision.allowed, decision.message
        p = service.ledger.get(decision.reservation_id)
        return sorted(service.ledger.index.nodes[s.node].info.leaf for s in p.group_plan)

    assert leaves(config()) == ["leaf-0"] * 4  # packed into one leaf
    limited = config(topology_constraints={"maxNodesPerLeaf": 2})
    assert leaves(limited) == ["leaf-0", "leaf-0", "leaf-1", "leaf-1"]


def test_the_sync_lease_term_reaches_the_cluster_sync_with_a_renewal_every_third_of_it():
    sync = WebhookConfig.from_mapping({"syncLeaseTermS": 12}).sync_config()
    assert (sync.lease_term_s, sync.lease_renew_s) == (12.0, 4.0)
    assert WebhookConfig().sync_config().lease_term_s == 30.0  # the default serve runs with
