"""gpuledger.webhook.kube.event_writer and the owner reader against the real kube-apiserver: the pod look-up,
the Event POST
and the owners' reads over the webhook's own connections (gpuledger.webhook.kube.api), with the credentials
of a
kubeconfig (the admin's token), and a refusal named as such."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from devcluster.kubeclient import ALICE
from gpuledger.names import RESERVATION_ID_KEY
from gpuledger.webhook.admission.owners import KubeObjectReader, OwnerLookupError
from gpuledger.webhook.kube.event_writer import ApiEventWriter
from gpuledger.webhook.kube.events import EventPoster, ObjectRef, placed
from gpuledger.webhook.serve import _kube_client


@pytest.fixture
def plain_namespace(apiserver):
    """A namespace not opted in to admission: the pods here are stored as written."""
    name = f"events-{uuid.uuid4().hex[:6]}"
    apiserver.create_namespace(name, admission=False, users=())
    yield name
    apiserver.force_delete("pods", namespace=name)
    apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


async def test_placed_pods_are_found_and_their_events_posted(apiserver, plain_namespace):
    ns = plain_namespace
    apiserver.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": ns, "labels": {RESERVATION_ID_KEY: "r-1"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
    )
    [stored] = apiserver.pods(ns)
    writer = ApiEventWriter(_kube_client(apiserver.kubeconfig))
    try:
        found = await writer.find_pods(ns, ["r-1", "r-never-stored"])
        assert found == {"r-1": ObjectRef("v1", "Pod", ns, "trainer", stored["metadata"]["uid"])}

        poster = EventPoster(writer)
        event = replace(placed(ns, "r-1", "placed on leaf-0-node-1 GPUs 0,1"), involved=found["r-1"])
        await writer.create(ns, poster.body(event))
        [posted] = apiserver.get_json("events", "-n", ns, "--field-selector", "reason=GPUPlaced")["items"]
        assert posted["involvedObject"]["uid"] == stored["metadata"]["uid"]
        assert posted["message"] == "placed on leaf-0-node-1 GPUs 0,1"
        assert posted["reportingComponent"] == "gpuledger.io/webhook"
    finally:
        await writer.close()


async def test_a_refused_post_names_the_status_and_what_the_api_server_said(apiserver, plain_namespace):
    ns = plain_namespace
    admin = ApiEventWriter(_kube_client(apiserver.kubeconfig))
    alice = ApiEventWriter(_kube_client(apiserver.kubeconfig_for(ALICE)))  # no role in this namespace
    try:
        with pytest.raises(
            RuntimeError, match=rf"POST /api/v1/namespaces/{ns}/events: HTTP 422: .*involvedObject"
        ):
            await admin.create(ns, {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "bad"}})
        with pytest.raises(
            RuntimeError, match=rf"POST /api/v1/namespaces/{ns}/events: HTTP 403: .*forbidden"
        ):
            await alice.create(ns, {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "x"}})
        with pytest.raises(RuntimeError, match=rf"GET /api/v1/namespaces/{ns}/pods: HTTP 403"):
            await alice.find_pods(ns, ["r-1"])
    finally:
        await admin.close()
        await alice.close()


async def test_credentials_are_read_once_a_while_and_again_after_a_401(apiserver, plain_namespace):
    """The client's refresh hook re-applies the whole kubeconfig, so it is asked every `auth_ttl_s`, not per
    request; a token that went stale in between (401) is read again at once and the request retried."""
    ns = plain_namespace
    now = [100.0]
    writer = ApiEventWriter(_kube_client(apiserver.kubeconfig), auth_ttl_s=60.0, clock=lambda: now[0])
    try:
        for _ in range(3):
            await writer.find_pods(ns, ["r-1"])
        assert writer.api.auth_reads == 1
        now[0] += 60.0
        await writer.find_pods(ns, ["r-1"])
        assert writer.api.auth_reads == 2
        writer.api._auth = {"authorization": "Bearer rotated-away"}  # what a rotated token looks like to us
        assert await writer.find_pods(ns, ["r-1"]) == {}  # answered, after one 401 and a fresh read
        assert writer.api.auth_reads == 3
    finally:
        await writer.close()


async def test_owners_are_read_on_the_loop_and_a_refusal_is_named(apiserver, plain_namespace):
    """KubeOwners' reader: built-in and missing workloads, the API's words on a refusal, and a burst of reads
    of different owners spread over its few kept-alive connections instead of a connection each."""
    ns = plain_namespace
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    apiserver.apply(
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": "web",
                    "namespace": ns,
                    "annotations": {"topology.scheduler/gpu-count": "2"},
                },
                "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template},
            },
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "train", "namespace": ns},
                "spec": {
                    "parallelism": 4,
                    "template": {**template, "spec": {**template["spec"], "restartPolicy": "Never"}},
                },
            },
        ]
    )
    reader = KubeObjectReader(_kube_client(apiserver.kubeconfig), connections=2)
    alice = KubeObjectReader(_kube_client(apiserver.kubeconfig_for(ALICE)))
    try:
        web = await reader("Deployment", ns, "web")
        assert (
            web["kind"] == "Deployment"
            and web["metadata"]["annotations"]["topology.scheduler/gpu-count"] == "2"
        )
        job = await reader("Job", ns, "train")
        assert job["kind"] == "Job" and job["spec"]["parallelism"] == 4
        assert await reader("StatefulSet", ns, "never-made") is None
        reads = await asyncio.gather(
            *(reader(kind, ns, name) for kind, name in [("Deployment", "web"), ("Job", "train")] * 5)
        )
        assert [r["metadata"]["name"] for r in reads] == ["web", "train"] * 5
        assert reader.api.opened <= 2
        with pytest.raises(OwnerLookupError, match=rf"reading Job {ns}/train: HTTP 403: .*forbidden"):
            await alice("Job", ns, "train")
    finally:
        await reader.close()
        await alice.close()
