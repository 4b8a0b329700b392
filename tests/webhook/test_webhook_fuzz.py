"""Hypothesis against the real server (plain HTTP on 127.0.0.1) and the parser:
no crash, every denial says why."""

from __future__ import annotations

import copy
import http.client
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.pods.annotation_values import ANNOTATIONS, AnnotationError
from gpuledger.core.pods.request import request_from_pod
from gpuledger.webhook.admission.review import make_review
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.transport.app import create_app
from gpuledger.webhook.transport.server import ServerThread
from tests.webhook.webhook_support import Clock, cluster, config, gpu_pod, handler, review, service

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
interesting = st.sampled_from(
    [
        "",
        "0",
        "1",
        "4",
        "16",
        "-1",
        "1.5",
        "1e3",
        "999",
        "1000",
        "true",
        "false",
        "TRUE",
        "yes",
        "maybe",
        "consolidated",
        "distributed",
        "balanced",
        "least-loaded",
        "best-fit",
        "cost-optimized",
        "round_robin",
        "high",
        "low",
        "leaf-0",
        "spine-0",
        "0=node-0000:0,1\n1=node-0001:2",
        "0=node-0000:99",
        "x=y:z",
        "0=node-0000:0,0",
        " 2 ",
        "\n",
        "💥",
        "a" * 300,
    ]
)
annotation_values = st.one_of(interesting, st.text(max_size=30))
annotations = st.dictionaries(
    st.sampled_from((*ANNOTATIONS, "gpuledger.io/placement", "other/key")), annotation_values, max_size=6
)


@pytest.fixture(scope="module")
def server():
    svc_client = InProcessLedgerClient(service(cluster(16, 8)), Clock())
    thread = ServerThread(lambda: create_app(config(max_body_bytes=64 * 1024), svc_client)).start()
    yield thread
    thread.stop()


def post(server, route: str, body: bytes, content_type: str = "application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", route, body=body, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def check_answer(status: int, raw: bytes, uid):
    assert status in (200, 400, 413), (status, raw[:300])
    data = json.loads(raw)
    if status != 200:
        assert data["error"]
        return
    r = data["response"]
    if isinstance(uid, str) and uid:
        assert r["uid"] == uid
    assert isinstance(r["allowed"], bool)
    if not r["allowed"]:
        assert r["status"]["message"], r
    assert r.get("status", {}).get("code") != 500, r


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ann=annotations, gpus=st.sampled_from([None, 0, 1, 2, 8, 9]), limits=st.booleans(), dry=st.booleans())
def test_fuzzed_annotations_over_http(server, ann, gpus, limits, dry):
    pod = gpu_pod(gpus, annotations=ann, limits=limits)
    for route in ("/mutate", "/validate"):
        body = json.dumps(make_review(pod, uid="fz", dry_run=dry)).encode()
        check_answer(*post(server, route, body), "fz")


PATHS = [
    ("request",),
    ("request", "object"),
    ("request", "object", "metadata"),
    ("request", "object", "metadata", "annotations"),
    ("request", "object", "metadata", "labels"),
    ("request", "object", "metadata", "ownerReferences"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "containers"),
    ("request", "object", "spec", "containers", 0, "resources"),
    ("request", "object", "spec", "affinity"),
    ("request", "object", "spec", "tolerations"),
    ("request", "object", "spec", "nodeSelector"),
    ("request", "kind"),
    ("request", "operation"),
    ("request", "dryRun"),
    ("request", "userInfo"),
    ("request", "oldObject"),
    ("apiVersion",),
    ("kind",),
    ("request", "uid"),
    ("request", "namespace"),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(PATHS),
    value=json_values,
    route=st.sampled_from(["/mutate", "/validate"]),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]),
)
def test_fuzzed_admission_reviews(server, path, value, route, operation):
    body = make_review(
        gpu_pod(1, annotations={"topology.scheduler/placement-strategy": "balanced"}),
        uid="u-fuzz",
        operation=operation,
        old=gpu_pod(1),
    )
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    uid = body.get("request", {}).get("uid") if isinstance(body.get("request"), dict) else None
    check_answer(*post(server, route, json.dumps(body).encode()), uid)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()),
    content_type=st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-8", ""]),
)
def test_fuzzed_bodies(server, raw, content_type):
    check_answer(*post(server, "/mutate", raw, content_type), None)


@settings(max_examples=300, deadline=None)
@given(ann=annotations, owner_ann=annotations, parallelism=json_values | st.integers(0, 10))
def test_parser_raises_only_annotation_errors_with_messages(ann, owner_ann, parallelism):
    pod = gpu_pod(None, annotations=ann, ownerReferences=[{"kind": "Job", "name": "j", "controller": True}])
    owner = {
        "kind": "Job",
        "metadata": {"name": "j", "annotations": owner_ann},
        "spec": {"parallelism": parallelism},
    }
    try:
        r = request_from_pod(copy.deepcopy(pod), owner, None, "rid")
    except AnnotationError as exc:
        text = str(exc)
        assert exc.annotation in text and "expected" in text
        return
    assert r is None or r.needs_gpu


@settings(max_examples=100, deadline=None)
@given(ann=annotations, dry=st.booleans())
def test_handler_denials_always_have_messages(ann, dry):
    import asyncio

    h, _ = handler(cluster(2, 8))
    d = asyncio.run(h.mutate(review(gpu_pod(1, annotations=ann), dry_run=dry)))
    assert d.code != 500, d.message
    if not d.allowed:
        assert d.message


_env = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "EPOCHS", "X"])},
        optional={"value": st.text(max_size=5)},
    ),
    max_size=3,
)
_container = st.fixed_dictionaries(
    {"name": st.text(max_size=3)},
    optional={
        "env": _env,
        "resources": st.sampled_from(
            [{}, {"limits": {"nvidia.com/gpu": "1"}}, {"requests": {"nvidia.com/gpu": "0", "cpu": "1"}}]
        ),
        "futureField": json_values,
    },
)
_meta_map = st.dictionaries(
    st.sampled_from(["gpuledger.io/placement", "gpuledger.io/reservation-id", "app", "a/b~c", "team"]),
    st.text(max_size=5),
    max_size=3,
)
_spec = st.fixed_dictionaries(
    {},
    optional={
        "containers": st.lists(_container, max_size=3),
        "initContainers": st.lists(_container, max_size=2),
        "schedulerName": st.sampled_from(["default-scheduler", "gpu-scheduler"]),
        "tolerations": st.lists(
            st.fixed_dictionaries({"key": st.sampled_from(["gpu", "other"]), "operator": st.just("Exists")}),
            max_size=2,
        ),
        "affinity": st.sampled_from(
            [
                {},
                {"podAffinity": {"x": 1}},
                {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}
                    }
                },
            ]
        ),
        "nodeName": st.sampled_from(["node-0000", "elsewhere"]),
        "someUnknownField": json_values,
    },
)
_pods = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {}, optional={"annotations": _meta_map | st.none(), "labels": _meta_map}
        )
    },
    optional={"spec": _spec | st.none(), "status": json_values},
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pod=_pods,
    binding=st.sampled_from(["affinity", "nodeName", "both"]),
    visibility=st.sampled_from(["runtime-uuids", "host-indices", "device-plugin"]),
    affinity_key=st.sampled_from(["kubernetes.io/hostname", "metadata.name"]),
    take_over=st.booleans(),
    tainted=st.booleans(),
)
def test_the_patch_turns_the_pod_into_the_mutated_pod_exactly(
    pod, binding, visibility, affinity_key, take_over, tainted
):
    """`patch_of` compares only the members the mutating path writes: on random pods, through every mode,
    applying it to the original gives the mutated pod, and the original is never touched."""
    import jsonpatch

    from gpuledger.core.model import BindingMode, Placement, Taint
    from gpuledger.webhook.admission import scheduler_name
    from gpuledger.webhook.admission.patch import apply_placement, patch_of, shallow_pod, strip_ledger_keys

    placement = Placement(
        id="r1",
        node="node-0000",
        devices=(0, 3),
        uuids=("GPU-a", "GPU-b"),
        tolerated_taints=(Taint("gpu", "", "NoSchedule"),) if tainted else (),
    )
    original = copy.deepcopy(pod)
    work = shallow_pod(pod)
    strip_ledger_keys(work)
    assert jsonpatch.apply_patch(pod, patch_of(pod, work)) == work  # the strip alone (no-GPU pods)
    if take_over:
        scheduler_name.take_over(work)
    apply_placement(
        work,
        placement,
        "signed",
        binding_mode=BindingMode(binding),
        visibility_mode=visibility,
        affinity_key=affinity_key,
    )
    ops = patch_of(pod, work)
    assert jsonpatch.apply_patch(pod, ops) == work
    assert pod == original
    # a reinvocation writing the same placement on the patched pod changes nothing
    again = jsonpatch.apply_patch(pod, ops)
    redo = shallow_pod(again)
    strip_ledger_keys(redo)
    redo["metadata"].setdefault("annotations", {})
    apply_placement(
        redo,
        placement,
        "signed",
        binding_mode=BindingMode(binding),
        visibility_mode=visibility,
        affinity_key=affinity_key,
    )
    assert patch_of(again, redo) == []
