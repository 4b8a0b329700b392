"""Pods of one shape: what the mutating handler reads before the ledger is worked out once per shape
(gpuledger.webhook.admission.shapes), and every pod still gets exactly what parsing it alone gives."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.pods.annotation_values import ANNOTATIONS, AnnotationError
from gpuledger.core.pods.placement_codec import decode_bound
from gpuledger.core.pods.pod_spec import PodRequestConfig
from gpuledger.core.pods.request import for_another_pod, pod_name, request_from_pod
from gpuledger.names import PLACEMENT_ANNOTATION, SCHEDULING_MAP
from gpuledger.webhook.admission.handler import AdmissionHandler
from gpuledger.webhook.admission.owners import StaticOwners
from gpuledger.webhook.admission.shapes import LAST_APPLIED, PodShapes
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from tests.webhook.webhook_support import HMAC_KEY, Clock, cluster, config, gpu_pod, review, service

PARSE = PodRequestConfig()


def run(coro):
    return asyncio.run(coro)


class RecordingLedger(InProcessLedgerClient):
    """The in-process ledger, keeping every request the handler asked it to place."""

    def __init__(self, svc):
        super().__init__(svc, Clock())
        self.requests = []

    async def admit(self, call):
        self.requests.append(call.request)
        return await super().admit(call)


def recording_handler(objects, owners=None, cfg=None):
    cfg = cfg or config()
    ledger = RecordingLedger(service(objects, cfg))
    return AdmissionHandler(cfg, ledger, owners), ledger


def another(pod: dict, name: str, **identity) -> dict:
    """`pod` as another pod of its template: the same but for its identity."""
    meta = {**pod["metadata"], "name": name, "uid": f"uid-{name}", **identity}
    annotations = dict(meta.get("annotations") or {})
    annotations[LAST_APPLIED] = json.dumps({"metadata": {"name": name}})
    meta["annotations"] = annotations
    return {**pod, "metadata": meta}


def shape_counts(h: AdmissionHandler) -> dict[str, float]:
    return {
        s.labels["outcome"]: s.value
        for metric in h.metrics.pod_shapes.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


# ------------------------------------------------------------------ the core's promise the memo rests on
annotation_values = st.sampled_from(
    ["", "0", "1", "2", "4", "-1", "1.5", "true", "false", "500", "16Gi", "high", "best-fit", "consolidated",
     "leaf-0", "A100", "0=node-0000:0\n1=node-0001:1", "0=node-0000:0,1", "x"]
)  # fmt: skip
pod_names = st.sampled_from(["train-0", "train-1", "train-7", "web", "web-abc12-3", ""])


@settings(max_examples=300, deadline=None)
@given(
    annotations=st.dictionaries(st.sampled_from(sorted(ANNOTATIONS)), annotation_values, max_size=4),
    limits=st.booleans(),
    first=pod_names,
    second=pod_names,
    owner=st.none() | st.dictionaries(st.sampled_from(sorted(ANNOTATIONS)), annotation_values, max_size=2),
)
def test_a_kept_request_serves_another_pod_of_its_shape_exactly_as_parsing_it(
    annotations, limits, first, second, owner
):
    """Whenever the memo keeps a pod's request (parsed, not pinned), the next pod of the shape gets through
    for_another_pod exactly what request_from_pod gives it: names with ordinals, generateName pods, maps."""
    a = another(gpu_pod(1, annotations=annotations, limits=limits), first)
    b = another(a, second, generateName="train-", creationTimestamp="2026-11-27T10:00:00Z")
    assert PodShapes().key(a, "default") == PodShapes().key(b, "default")
    job = None
    if owner is not None:  # a Job of two pods, annotated too (a gang when asked)
        job = {"kind": "Job", "metadata": {"name": "train", "namespace": "default", "annotations": owner},
               "spec": {"parallelism": 2, "template": {"spec": a["spec"]}}}  # fmt: skip
    try:
        kept = request_from_pod(a, job, PARSE, "rid-a")
    except AnnotationError:
        return  # a denial is never kept
    if kept is not None and kept.pinned is not None:
        with pytest.raises(ValueError, match="gpu-scheduling-map"):
            for_another_pod(kept, "rid-b", pod_name(b))
        return  # never kept: a map's entry follows the pod's name
    fresh = request_from_pod(b, job, PARSE, "rid-b")
    assert (None if kept is None else for_another_pod(kept, "rid-b", pod_name(b))) == fresh


def test_what_is_not_identity_makes_another_shape():
    shapes = PodShapes()
    pod = gpu_pod(1, name="a", annotations={"agentaflow.gpu/scheduling-strategy": "best-fit"})
    key = shapes.key(pod, "default")
    assert shapes.key(another(pod, "b"), "default") == key
    assert shapes.key(pod, "ml") != key  # the namespace
    changed = another(pod, "a")
    changed["metadata"]["annotations"]["agentaflow.gpu/scheduling-strategy"] = "least-loaded"
    assert shapes.key(changed, "default") != key
    labelled = {**pod, "metadata": {**pod["metadata"], "labels": {"apps.kubernetes.io/pod-index": "3"}}}
    assert shapes.key(labelled, "default") != key  # an index label is no identity: it picks map entries
    bigger = json.loads(json.dumps(pod))
    bigger["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    assert shapes.key(bigger, "default") != key
    # a last-applied copy that is not a string is part of the shape (the parser refuses it)
    odd = {**pod, "metadata": {**pod["metadata"], "annotations": {LAST_APPLIED: 1}}}
    assert shapes.key(odd, "default") != shapes.key(
        {**pod, "metadata": {**pod["metadata"], "annotations": {LAST_APPLIED: 2}}}, "default"
    )
    # what JSON has no spelling for is parsed apart, never a crash
    assert shapes.key({"metadata": {"name": "x", "annotations": {1: "x"}}}, "default") is None
    assert shapes.key({"metadata": {"name": "x"}, "spec": {"a": "\ud800"}}, "default") is None


def test_the_oldest_shapes_go_first():
    shapes = PodShapes(capacity=2)
    for i in range(3):
        shapes.remember_request((b"%d" % i, b""), None)
    assert list(shapes.requests) == [(b"1", b""), (b"2", b"")]


# ------------------------------------------------------------------ through the handler
def test_pods_of_one_template_are_read_once_and_each_placed_as_itself():
    h, ledger = recording_handler(cluster(2, 8))
    first = gpu_pod(1, name="train-a", annotations={"agentaflow.gpu/scheduling-strategy": "best-fit"})
    pods = [another(first, f"train-{c}") for c in "abc"]
    decisions = [run(h.mutate(review(p, namespace="default"))) for p in pods]
    assert [d.outcome for d in decisions] == ["placed"] * 3
    assert shape_counts(h) == {"miss": 1.0, "hit": 2.0}
    for pod, asked, decision in zip(pods, ledger.requests, decisions, strict=True):
        # what the ledger was asked is what parsing this pod alone gives, under its own id
        assert asked == request_from_pod(pod, None, PARSE, asked.id, namespace="default")
        assert asked.name == pod["metadata"]["name"] and decision.reservation_id == asked.id
        ops = decision.patch
        [annotation] = [
            op["value"] for op in ops if op["path"].endswith(PLACEMENT_ANNOTATION.replace("/", "~1"))
        ]
        placement, binding = decode_bound(annotation, HMAC_KEY.encode())
        assert binding.name == pod["metadata"]["name"] and placement.id == asked.id
    assert len({r.id for r in ledger.requests}) == 3 and len({r.seed for r in ledger.requests}) == 3


def test_pinned_pods_of_one_template_each_take_their_own_map_entry():
    h, ledger = recording_handler(cluster(2, 8))
    pinned = gpu_pod(
        1, name="train-0", annotations={SCHEDULING_MAP: "0=node-0000:3\n1=node-0001:5\n2=node-0000:6"}
    )
    decisions = [run(h.mutate(review(another(pinned, f"train-{i}")))) for i in (0, 1, 2)]
    assert [(d.node, d.devices) for d in decisions] == [
        ("node-0000", (3,)),
        ("node-0001", (5,)),
        ("node-0000", (6,)),
    ]
    assert shape_counts(h) == {"miss": 3.0}


def test_a_refused_shape_is_refused_every_time_and_never_kept():
    h, _ = recording_handler(cluster(1, 8))
    pod = gpu_pod(1, name="greedy-0")
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    for name in ("greedy-0", "greedy-1"):
        decision = run(h.mutate(review(another(pod, name))))
        assert not decision.allowed and decision.code == 403 and "NVIDIA_VISIBLE_DEVICES" in decision.message
        assert name in decision.message  # each denial names its own pod
    assert not h.shapes.checked and not h.shapes.requests


def test_a_bad_annotation_is_denied_for_every_pod_of_the_shape():
    h, _ = recording_handler(cluster(1, 8))
    pod = gpu_pod(None, name="bad-0", annotations={"topology.scheduler/gpu-count": "lots"})
    for name in ("bad-0", "bad-1"):
        decision = run(h.mutate(review(another(pod, name))))
        assert (
            decision.code == 422
            and "topology.scheduler/gpu-count" in decision.message
            and name in decision.message
        )
    assert not h.shapes.requests


def test_a_changed_owner_makes_a_new_shape():
    """The request of a Job's pod depends on the Job (its annotations, its size): a Job read anew with
    other annotations is another shape."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "default", "uid": "uid-train",
                     "annotations": {"agentaflow.gpu/scheduling-strategy": "best-fit"}},
        "spec": {"parallelism": 1},
    }  # fmt: skip
    owners = StaticOwners([job])
    h, ledger = recording_handler(cluster(2, 8), owners=owners)
    pod = gpu_pod(1, name="train-x")
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "uid-train", "controller": True}
    ]
    run(h.mutate(review(another(pod, "train-x"))))
    run(h.mutate(review(another(pod, "train-y"))))
    owners.add(
        {
            **job,
            "metadata": {
                **job["metadata"],
                "annotations": {"agentaflow.gpu/scheduling-strategy": "least-loaded"},
            },
        }
    )
    run(h.mutate(review(another(pod, "train-z"))))
    assert [r.strategy for r in ledger.requests] == ["best_fit", "best_fit", "least_utilized"]
    assert shape_counts(h) == {"miss": 2.0, "hit": 1.0}


def test_a_reinvocation_is_read_apart():
    h, _ = recording_handler(cluster(1, 8))
    pod = gpu_pod(1, name="again")
    first = run(h.mutate(review(pod)))
    from tests.webhook.webhook_support import apply_patch

    placed = apply_patch(pod, first.patch)
    again = run(h.mutate(review(placed)))
    assert again.outcome == "reused" and again.reservation_id == first.reservation_id
    assert shape_counts(h) == {"miss": 1.0, "apart": 1.0}
