"""spec.schedulerName: the earlier tools' schedulers are taken over, anyone else's pods are left alone."""

from __future__ import annotations

import asyncio

import pytest

from gpuledger.webhook.admission import scheduler_name
from gpuledger.webhook.config import WebhookConfig
from tests.webhook.webhook_support import apply_patch, cluster, config, gpu_pod, handler, review


def run(coro):
    return asyncio.run(coro)


def with_scheduler(pod: dict, name: str | None) -> dict:
    if name is not None:
        pod["spec"]["schedulerName"] = name
    return pod


def test_defaults_name_the_earlier_tools_schedulers():
    # gpu-scheduling-map's `schedulerName: gpu-scheduler`, topology-aware-scheduler's own name
    assert set(WebhookConfig().takeover_scheduler_names) == {"gpu-scheduler", "topology-aware-scheduler"}


@pytest.mark.parametrize(
    "name,verdict",
    [
        (None, scheduler_name.OURS),
        ("default-scheduler", scheduler_name.OURS),
        ("gpu-scheduler", scheduler_name.TAKEOVER),
        ("topology-aware-scheduler", scheduler_name.TAKEOVER),
        ("volcano", scheduler_name.OTHER),
        ("GPU-Scheduler", scheduler_name.OTHER),  # names are exact, as the API server compares them
    ],
)
def test_choose(name, verdict):
    choice = scheduler_name.choose(with_scheduler(gpu_pod(1), name), WebhookConfig().takeover_scheduler_names)
    assert choice.verdict == verdict
    assert bool(choice.warning) == (verdict != scheduler_name.OURS)
    assert len(choice.warning) <= 256  # the API server may cut longer warnings


@pytest.mark.parametrize("name", ["gpu-scheduler", "topology-aware-scheduler"])
def test_taken_over_pod_gets_default_scheduler_a_placement_and_a_warning(name):
    h, svc = handler(cluster(2, 8))
    pod = with_scheduler(gpu_pod(2), name)
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.outcome == "placed" and len(d.devices) == 2
    out = apply_patch(pod, d.patch)
    assert out["spec"]["schedulerName"] == "default-scheduler"
    assert {"op": "replace", "path": "/spec/schedulerName", "value": "default-scheduler"} in d.patch
    assert any(f"spec.schedulerName '{name}' was replaced by 'default-scheduler'" in w for w in d.warnings)
    assert svc.stats().reservations_pending == 1


def test_taken_over_pod_without_gpus_is_still_handed_to_the_default_scheduler():
    # the old scheduler is gone: any pod naming it would stay Pending, GPU or not
    h, _ = handler(cluster(1, 8))
    pod = with_scheduler(gpu_pod(None), "gpu-scheduler")
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.outcome == "no_gpu"
    assert apply_patch(pod, d.patch)["spec"]["schedulerName"] == "default-scheduler"
    assert d.warnings


def test_taken_over_pod_that_cannot_be_placed_is_denied_as_any_other():
    h, _ = handler(cluster(1, 8))
    d = run(h.mutate(review(with_scheduler(gpu_pod(99), "gpu-scheduler"))))
    assert not d.allowed and d.code == 403 and not d.patch


def test_another_schedulers_pod_is_allowed_unchanged_unplaced_with_the_reason():
    h, svc = handler(cluster(2, 8))
    pod = with_scheduler(gpu_pod(2), "volcano")
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.outcome == "other_scheduler" and d.patch == []
    assert d.node is None and d.reservation_id is None
    assert len(d.warnings) == 1 and "'volcano' is another scheduler's" in d.warnings[0]
    assert "reserved no GPU" in d.warnings[0]
    assert svc.stats().reservations_pending == 0


def test_another_schedulers_pod_with_a_bad_annotation_is_not_denied():
    # its annotations are for its own scheduler: gpuledger does not judge them
    h, _ = handler(cluster(1, 8))
    pod = with_scheduler(gpu_pod(None, annotations={"topology.scheduler/gpu-count": "lots"}), "volcano")
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.outcome == "other_scheduler"


def test_another_schedulers_pod_still_loses_forged_ledger_keys():
    h, _ = handler(cluster(1, 8))
    pod = with_scheduler(gpu_pod(1, labels={"gpuledger.io/reservation-id": "forged"}), "volcano")
    d = run(h.mutate(review(pod)))
    assert d.allowed and "gpuledger.io/reservation-id" not in apply_patch(pod, d.patch)["metadata"]["labels"]
    assert len(d.warnings) == 2


def test_takeover_list_is_configurable():
    h, _ = handler(cluster(1, 8), config(takeover_scheduler_names=("volcano",)))
    pod = with_scheduler(gpu_pod(1), "volcano")
    d = run(h.mutate(review(pod)))
    assert d.outcome == "placed" and apply_patch(pod, d.patch)["spec"]["schedulerName"] == "default-scheduler"
    d = run(h.mutate(review(with_scheduler(gpu_pod(1), "gpu-scheduler"))))
    assert d.outcome == "other_scheduler"


def test_takeover_names_load_from_yaml_in_camel_case(tmp_path):
    path = tmp_path / "webhook.yaml"
    path.write_text("takeoverSchedulerNames: [gpu-scheduler, my-old-scheduler]\n")
    assert list(WebhookConfig.from_file(path).takeover_scheduler_names) == [
        "gpu-scheduler",
        "my-old-scheduler",
    ]


def test_reinvocation_after_takeover_reuses_the_placement():
    h, svc = handler(cluster(1, 8))
    pod = with_scheduler(gpu_pod(1), "gpu-scheduler")
    first = run(h.mutate(review(pod)))
    again = run(h.mutate(review(apply_patch(pod, first.patch))))
    assert again.outcome == "reused" and again.patch == [] and not again.warnings
    assert svc.stats().reservations_pending == 1
