"""A signed placement is bound to where it was issued: the webhook signs the namespace and the pod's name (or
generateName and controller uid), denies a placement on any other pod naming the field, and still reads the
legacy unbound (version 1) annotations."""

from __future__ import annotations

import asyncio
import json

from gpuledger.core.model import Placement
from gpuledger.core.pods.placement_codec import Binding, binding_mismatch, decode_bound, encode_placement
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY
from tests.webhook.webhook_support import HMAC_KEY, apply_patch, cluster, gpu_pod, handler, review

KEY = HMAC_KEY.encode()


def run(coro):
    return asyncio.run(coro)


def admitted(h, pod):
    d = run(h.mutate(review(pod)))
    assert d.allowed, d.message
    return apply_patch(pod, d.patch), d


def test_the_signature_binds_namespace_and_name():
    h, _ = handler(cluster(1, 8))
    out, d = admitted(h, gpu_pod(1, name="train-0", namespace="ml"))
    text = out["metadata"]["annotations"][PLACEMENT_ANNOTATION]
    assert json.loads(text)["v"] == 2
    placement, binding = decode_bound(text, KEY)
    assert placement.id == d.reservation_id and binding == Binding("ml", "train-0")
    forged = text.replace('"ns":"ml"', '"ns":"other"')  # re-binding breaks the signature
    assert decode_bound(forged, KEY) is None


def test_a_generate_name_pod_binds_its_prefix_and_controller():
    h, _ = handler(cluster(1, 8))
    pod = gpu_pod(1, namespace="ml")
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "web-"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-1", "controller": True}
    ]
    out, _ = admitted(h, pod)
    _, binding = decode_bound(out["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
    assert binding == Binding("ml", generate_name="web-", owner_uid="rs-1")
    stored = json.loads(json.dumps(out))
    stored["metadata"]["name"] = "web-x7k2p"
    assert binding_mismatch(binding, stored) == ""
    stranger = json.loads(json.dumps(stored))
    stranger["metadata"]["ownerReferences"][0]["uid"] = "rs-2"
    assert "metadata.ownerReferences" in binding_mismatch(binding, stranger)
    renamed = json.loads(json.dumps(stored))
    renamed["metadata"]["name"] = "db-1"
    assert "generateName" in binding_mismatch(binding, renamed)


def test_validate_denies_a_copy_in_another_namespace_naming_the_field():
    h, svc = handler(cluster(1, 8))
    original, d = admitted(h, gpu_pod(1, name="train-0", namespace="ml"))
    copy = json.loads(json.dumps(original))
    copy["metadata"]["namespace"] = "other"
    v = run(h.validate(review(copy)))
    assert not v.allowed and v.code == 403
    assert "metadata.namespace 'other'" in v.message and PLACEMENT_ANNOTATION in v.message
    assert run(h.validate(review(original))).allowed  # the copy did not take the original's claim
    dry = run(h.validate(review(copy, dry_run=True)))
    assert not dry.allowed and "metadata.namespace" in dry.message


def test_a_copy_is_not_taken_for_a_reinvocation():
    h, _ = handler(cluster(1, 8))
    original, first = admitted(h, gpu_pod(2, name="a", namespace="ml"))
    copy = json.loads(json.dumps(original))
    copy["metadata"]["name"] = "b"
    again = run(h.mutate(review(copy)))
    assert again.allowed and again.reservation_id != first.reservation_id
    assert not set(again.devices) & set(first.devices)


def test_a_legacy_unbound_placement_is_still_honoured():
    h, svc = handler(cluster(1, 8))
    _, d = admitted(h, gpu_pod(1, name="old", namespace="ml"))
    held = svc.lookup([d.reservation_id])[0]
    legacy = encode_placement(held.placement, KEY)  # version 1: no binding
    assert json.loads(legacy)["v"] == 1 and decode_bound(legacy, KEY) == (held.placement, None)
    pod = gpu_pod(1, name="old", namespace="ml")
    pod["metadata"]["annotations"][PLACEMENT_ANNOTATION] = legacy
    pod["metadata"]["labels"] = {RESERVATION_ID_KEY: d.reservation_id}
    assert run(h.validate(review(pod))).allowed


def test_an_unknown_version_is_not_read():
    p = Placement(id="r", node="n", devices=(0,))
    text = encode_placement(p, KEY, Binding("ns", "pod")).replace('"v":2', '"v":3')
    assert decode_bound(text, b"") is None
