"""Both groups' GPUWorkloads map to one request, and the request to a Job the webhook places."""

from __future__ import annotations

import pytest

from gpuledger.controller import crds, mapping
from gpuledger.controller.mapping import SpecError, from_object, job_manifest, job_name, webhook_annotations
from gpuledger.names import AGENTAFLOW_GROUP, WARP_GROUP, WORKLOAD_UID_LABEL
from gpuledger.service.settings import strategy_names
from tests.controller.support import agentaflow, warp


def test_agentaflow_fields():
    req = from_object(
        agentaflow(
            gpus=2, priority=5, gpuMemoryRequired=8192, schedulingStrategy="least_utilized", parallelism=4
        )
    )
    assert (req.key.group, req.gpus, req.parallelism, req.total_gpus, req.priority) == (
        "agentaflow.io",
        2,
        4,
        8,
        5,
    )
    assert (req.memory_mib, req.strategy, req.exclusive) == (8192, "least_utilized", True)
    assert req.created == mapping.parse_time("2027-01-15T08:00:00Z")


def test_warp_fields_and_priority_words():
    req = from_object(
        warp(
            gpus=3,
            priority="high",
            schedulingStrategy="leastLoaded",
            retryPolicy={"maxRetries": 5, "backoffSeconds": 30},
        )
    )
    assert (req.key.group, req.gpus, req.priority, req.strategy) == ("gpu.warp.dev", 3, 100, "least_utilized")
    assert (req.retry.max_retries, req.retry.backoff_s, req.retry.max_backoff_s) == (5, 30.0, 300.0)
    assert from_object(warp(priority=7)).priority == 7
    assert from_object(warp(priority="CRITICAL")).priority == 1000
    assert from_object(warp(priority=None)).priority == 0


def test_the_same_workload_in_both_groups_is_the_same_request_but_its_key():
    a = from_object(agentaflow(gpus=2, priority=100, schedulingStrategy="best_fit"))
    w = from_object(warp(gpus=2, priority="high", schedulingStrategy="bestFit"))
    for name in ("gpus", "parallelism", "priority", "strategy", "exclusive", "retry", "suspend"):
        assert getattr(a, name) == getattr(w, name), name


@pytest.mark.parametrize(
    "group,words", [(AGENTAFLOW_GROUP, crds.AGENTAFLOW_STRATEGIES), (WARP_GROUP, crds.WARP_STRATEGIES)]
)
def test_every_strategy_word_of_the_crds_maps_to_a_registered_strategy(group, words):
    make = agentaflow if group == "agentaflow.io" else warp
    for word in words:
        req = from_object(make(schedulingStrategy=word))
        assert req.strategy in strategy_names() or req.topology_strategy in crds.TOPOLOGY_STRATEGIES, word


@pytest.mark.parametrize(
    "obj,field",
    [
        (agentaflow(gpus=-1), "gpuRequirements.gpuCount"),
        (agentaflow(schedulingStrategy="fastest"), "schedulingStrategy"),
        (agentaflow(modelName="x"), "modelName"),
        (warp(gpus=0), "gpuCount"),
        (warp(priority="urgent"), "priority"),
        (warp(podTemplate={}), "podTemplate"),
        (warp(schedulingStrategy="least_utilized"), "schedulingStrategy"),
        (warp(parallelism=0), "parallelism"),
        (
            agentaflow(schedulingStrategy="random", topology={"placementStrategy": "distributed"}),
            "schedulingStrategy",
        ),
    ],
)
def test_bad_fields_are_named(obj, field):
    with pytest.raises(SpecError) as err:
        from_object(obj)
    assert err.value.field == field
    assert f"spec.{field}=" in str(err.value)


def test_job_is_owned_annotated_and_gang_shaped():
    req = from_object(
        warp(
            gpus=2,
            parallelism=4,
            priority="high",
            topology={"placementStrategy": "distributed"},
            activeDeadlineSeconds=600,
        )
    )
    job = job_manifest(req, attempt=2, deadline_left_s=500)
    assert job["metadata"]["name"] == job_name(req, 2) and job["metadata"]["name"].endswith("-2")
    owner = job["metadata"]["ownerReferences"][0]
    assert owner == {
        "apiVersion": "gpu.warp.dev/v1alpha1",
        "kind": "GPUWorkload",
        "name": "llama",
        "uid": "uid-w-llama",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (4, 4, 0)
    assert spec["completionMode"] == "Indexed" and spec["activeDeadlineSeconds"] == 500
    ann = spec["template"]["metadata"]["annotations"]
    assert ann["topology.scheduler/gpu-count"] == "2"  # per pod: the Job's parallelism makes the gang
    assert ann["topology.scheduler/placement-strategy"] == "distributed"
    assert ann["agentaflow.gpu/priority"] == "100"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["template"]["spec"]["containers"][0]["image"] == "vllm"
    assert spec["template"]["metadata"]["labels"][WORKLOAD_UID_LABEL] == "uid-w-llama"


def test_same_name_in_both_groups_gets_different_jobs():
    a = from_object(agentaflow(name="x"))
    w = from_object(warp(name="x"))
    assert job_name(a, 1) != job_name(w, 1)


def test_shared_gpu_by_memory():
    req = from_object(
        agentaflow(gpus=1, gpuMemoryRequired=4096, gpuRequirements={"gpuCount": 1, "exclusiveAccess": False})
    )
    ann = webhook_annotations(req)
    assert ann["agentaflow.gpu/exclusive-access"] == "false" and ann["agentaflow.gpu/memory"] == "4096"
    assert "topology.scheduler/gpu-count" not in ann


def test_warp_job_template_is_used():
    tmpl = {
        "spec": {
            "ttlSecondsAfterFinished": 60,
            "parallelism": 9,
            "template": {"spec": {"containers": [{"name": "c", "image": "img"}]}},
        }
    }
    obj = warp(jobTemplate=tmpl)
    del obj["spec"]["image"]
    job = job_manifest(from_object(obj), 1)
    assert job["spec"]["ttlSecondsAfterFinished"] == 60 and job["spec"]["parallelism"] == 1
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "img"
