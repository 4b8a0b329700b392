"""The GPUQueue CRD and the core's parser name the same fields; `kubectl get gpuqueues` shows quota, used,
borrowed and waiting; the API server refuses what the schema refuses and fills its defaults, which the
parser reads back (e2e: the real kube-apiserver)."""

from __future__ import annotations

import json

import pytest

from gpuledger.controller import crds
from gpuledger.core.queues.gpu_queues import GPUQueue, ProductQuota, queue_from_object
from gpuledger.names import GPUQUEUE_PLURAL, QUEUE_API_VERSION, QUEUE_GROUP
from tests.cli.conftest import parse_table

CRD_NAME = f"{GPUQUEUE_PLURAL}.{QUEUE_GROUP}"


def schema() -> dict:
    return crds.gpuqueue_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]


def test_the_crd_is_cluster_scoped_in_gpuledgers_group():
    crd = crds.gpuqueue_crd()
    assert crd["metadata"]["name"] == CRD_NAME
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == "GPUQueue"
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_the_printer_columns_show_quota_used_borrowed_waiting():
    columns = {
        c["name"]: c["jsonPath"]
        for c in crds.gpuqueue_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert columns["Quota"] == ".status.quota"
    assert columns["Used"] == ".status.used"
    assert columns["Borrowed"] == ".status.borrowed"
    assert columns["Waiting"] == ".status.waiting"
    status = schema()["status"]["properties"]
    assert {"quota", "used", "borrowed", "waiting"} <= set(status)


def test_every_spec_field_the_schema_declares_is_one_the_parser_reads():
    spec = schema()["spec"]["properties"]
    full = {
        "quotas": [{"product": "H100", "gpus": 8, "borrowingLimit": 8, "lendingLimit": 4}],
        "weight": 2,
        "parent": "org",
        "default": False,
        "namespaceSelector": {"matchLabels": {"a": "b"}, "matchExpressions": []},
        "preemption": {
            "reclaim": True,
            "withinQueue": True,
            "criticalAcrossQueues": True,
            "minRunSeconds": 1,
        },
    }
    assert set(full) == set(spec)
    assert set(full["quotas"][0]) == set(spec["quotas"]["items"]["properties"])
    assert set(full["preemption"]) == set(spec["preemption"]["properties"])
    assert set(full["namespaceSelector"]) == set(spec["namespaceSelector"]["properties"])
    queue_from_object({"metadata": {"name": "team"}, "spec": full})  # every field read, none refused


@pytest.mark.e2e
def test_the_api_server_serves_gpuqueues(apiserver):
    apiserver.apply(crds.gpuqueue_crd())
    apiserver.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
    team = {
        "apiVersion": QUEUE_API_VERSION,
        "kind": "GPUQueue",
        "metadata": {"name": "e2e-team-a"},
        "spec": {"quotas": [{"gpus": 64}], "namespaceSelector": {"matchLabels": {"team": "a"}}},
    }
    apiserver.apply(team)
    stored = apiserver.get_json(GPUQUEUE_PLURAL, "e2e-team-a")
    # the schema's defaults, filled in by the API server, are the parser's defaults
    assert stored["spec"]["quotas"] == [{"product": "any", "gpus": 64}]
    assert stored["spec"]["weight"] == 1 and stored["spec"]["default"] is False
    assert "preemption" not in stored["spec"]  # (defaults fill only the objects that are there)
    assert queue_from_object(stored) == GPUQueue(
        "e2e-team-a",
        (ProductQuota("any", 64),),
        namespace_selector=queue_from_object(team).namespace_selector,
    )
    status = {"status": {"quota": 64, "used": 128, "borrowed": 64, "waiting": 3, "share": 0.5}}
    apiserver.kubectl(
        "patch",
        GPUQUEUE_PLURAL,
        "e2e-team-a",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    rows = parse_table(apiserver.kubectl("get", GPUQUEUE_PLURAL).stdout.splitlines())
    row = next(r for r in rows if r["NAME"] == "e2e-team-a")
    assert (row["QUOTA"], row["USED"], row["BORROWED"], row["WAITING"]) == ("64", "128", "64", "3")
    assert apiserver.kubectl("get", "gq", "e2e-team-a", "-o", "name").stdout.strip() == (
        f"gpuqueue.{QUEUE_GROUP}/e2e-team-a"
    )
    bad = dict(team, metadata={"name": "e2e-bad"}, spec={"quotas": [{"gpus": 4, "lendingLimit": 8}]})
    refused = apiserver.apply(bad, check=False)
    assert refused.returncode != 0 and "lendingLimit must not exceed gpus" in refused.stderr
    zero = dict(team, metadata={"name": "e2e-zero"}, spec={"weight": 0})
    refused = apiserver.apply(zero, check=False)
    assert refused.returncode != 0 and "spec.weight" in refused.stderr
