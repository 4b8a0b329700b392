"""GPUQueue objects -> the queue model: defaults, the two-level tree, the default queue, namespace selection,
and a refusal naming the field, the value and what is accepted for each thing gpuledger cannot honour."""

from __future__ import annotations

import pytest

from gpuledger.core.model import SelectorRequirement
from gpuledger.core.queues.gpu_queues import (
    ANY_PRODUCT,
    IMPLICIT_DEFAULT,
    GPUQueue,
    LabelSelector,
    PreemptionRules,
    ProductQuota,
    QueueError,
    QueueSet,
    queue_from_object,
    queue_set_from_objects,
)


def obj(name: str, **spec) -> dict:
    return {
        "apiVersion": "gpuledger.io/v1alpha1",
        "kind": "GPUQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_a_full_queue_is_read():
    q = queue_from_object(
        obj(
            "team-a",
            parent="research",
            weight=2.5,
            namespaceSelector={
                "matchLabels": {"team": "a"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["prod", "dev"]}],
            },
            quotas=[
                {"product": "NVIDIA-H100-80GB-HBM3", "gpus": 32, "borrowingLimit": 16, "lendingLimit": 8},
                {"product": "ANY", "gpus": 8},
            ],
            preemption={
                "reclaim": False,
                "withinQueue": True,
                "criticalAcrossQueues": True,
                "minRunSeconds": 600,
            },
        )
    )
    assert q == GPUQueue(
        name="team-a",
        quotas=(ProductQuota("NVIDIA-H100-80GB-HBM3", 32, 16, 8), ProductQuota(ANY_PRODUCT, 8)),
        weight=2.5,
        parent="research",
        namespace_selector=LabelSelector(
            (("team", "a"),), (SelectorRequirement("tier", "In", ("prod", "dev")),)
        ),
        preemption=PreemptionRules(
            reclaim=False, within_queue=True, critical_across_queues=True, min_run_s=600
        ),
    )
    assert q.quotas[0].kept == 24 and q.quotas[1].kept == 0
    assert q.total_gpus == 40


def test_defaults():
    q = queue_from_object(obj("q"))
    assert q == GPUQueue("q")
    assert q.weight == 1.0 and q.parent is None and q.namespace_selector is None and not q.default
    assert q.preemption == PreemptionRules(True, True, False, 0.0)
    assert queue_from_object({"metadata": {"name": "q"}}) == GPUQueue("q")  # no spec at all


def test_buckets_file_a_product_under_its_entry_else_any_else_itself():
    q = GPUQueue("q", (ProductQuota("NVIDIA-H100-80GB-HBM3", 8), ProductQuota(ANY_PRODUCT, 4)))
    assert q.bucket("nvidia-h100-80gb-hbm3") == "NVIDIA-H100-80GB-HBM3"  # any case
    assert q.bucket("A100") == ANY_PRODUCT
    assert q.quota(ANY_PRODUCT).gpus == 4
    only_h100 = GPUQueue("q", (ProductQuota("H100", 8),))
    assert only_h100.bucket("A100") == "A100"
    assert only_h100.quota("A100") == ProductQuota("A100", 0)  # no quota: all of it borrowed


@pytest.mark.parametrize(
    "spec, field, accepted",
    [
        ({"weight": 0}, "spec.weight", "above 0"),
        ({"weight": "heavy"}, "spec.weight", "a number"),
        ({"weight": True}, "spec.weight", "a number"),
        ({"quotas": {"gpus": 1}}, "spec.quotas", "a list"),
        ({"quotas": [{"gpus": -1}]}, "spec.quotas[0].gpus", "an integer from 0"),
        ({"quotas": [{"gpus": 1.5}]}, "spec.quotas[0].gpus", "an integer from 0"),
        ({"quotas": [{"product": "any"}]}, "spec.quotas[0].gpus", "an integer"),
        ({"quotas": [{"gpus": 4, "lendingLimit": 5}]}, "spec.quotas[0].lendingLimit", "the quota's gpus (4)"),
        ({"quotas": [{"gpus": 4, "borrowingLimit": -2}]}, "spec.quotas[0].borrowingLimit", "an integer"),
        ({"quotas": [{"gpus": 4, "flavor": "x"}]}, "spec.quotas[0].flavor", "one of product, gpus"),
        (
            {"quotas": [{"product": "H100", "gpus": 1}, {"product": "h100", "gpus": 2}]},
            "spec.quotas[1].product",
            "quotas[0] does",
        ),
        ({"quotas": [{"product": " ", "gpus": 1}]}, "spec.quotas[0].product", "a GPU product"),
        ({"parent": "Not A Name"}, "spec.parent", "another GPUQueue"),
        ({"parent": "q"}, "spec.parent", "another GPUQueue"),
        ({"default": "yes"}, "spec.default", "true or false"),
        ({"namespaceSelector": ["team"]}, "spec.namespaceSelector", "a label selector"),
        (
            {"namespaceSelector": {"matchLabels": {"a": 1}}},
            "spec.namespaceSelector.matchLabels",
            "string values",
        ),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}},
            "spec.namespaceSelector.matchExpressions[0].operator",
            "In | NotIn | Exists | DoesNotExist",
        ),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.namespaceSelector.matchExpressions[0].values",
            "at least one value",
        ),
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                }
            },
            "spec.namespaceSelector.matchExpressions[0].values",
            "no values",
        ),
        ({"preemption": {"minRunSeconds": -1}}, "spec.preemption.minRunSeconds", "an integer from 0"),
        ({"preemption": {"reclaim": "always"}}, "spec.preemption.reclaim", "true or false"),
        ({"preemption": {"never": True}}, "spec.preemption.never", "one of reclaim"),
        ({"cohort": "x"}, "spec.cohort", "one of the fields"),
    ],
)
def test_a_refusal_names_the_field_the_value_and_what_is_accepted(spec, field, accepted):
    with pytest.raises(QueueError) as err:
        queue_from_object(obj("q", **spec))
    message = str(err.value)
    assert message.startswith(f"GPUQueue q: {field}="), message
    assert accepted in message, message


def test_a_bad_name_is_refused():
    with pytest.raises(QueueError, match=r"GPUQueue metadata.name=.*DNS subdomain"):
        queue_from_object({"metadata": {"name": "Team A"}, "spec": {}})


def test_the_tree_is_two_levels_with_workloads_in_the_leaves():
    qs = queue_set_from_objects(
        [
            obj("research", quotas=[{"gpus": 96}]),
            obj("team-a", parent="research", namespaceSelector={"matchLabels": {"team": "a"}}),
            obj("team-b", parent="research", namespaceSelector={"matchLabels": {"team": "b"}}),
            obj("ops", quotas=[{"gpus": 32}], default=True),
        ]
    )
    assert qs.children == {"research": ("team-a", "team-b")}
    assert qs.leaves() == ["ops", "team-a", "team-b"]
    assert qs.top_level() == ["ops", "research"]
    assert qs.path("team-a") == ("team-a", "research") and qs.path("ops") == ("ops",)
    assert qs.top("team-b") == "research"
    assert qs.siblings_level("team-a", "team-b") == ("team-a", "team-b")
    assert qs.siblings_level("team-a", "ops") == ("research", "ops")
    assert qs.default == "ops" and IMPLICIT_DEFAULT not in qs


def test_tree_refusals():
    with pytest.raises(QueueError, match=r"GPUQueue a: spec.parent='nowhere'.*existing GPUQueue"):
        queue_set_from_objects([obj("a", parent="nowhere")])
    with pytest.raises(QueueError, match=r"GPUQueue c: spec.parent='b'.*two levels deep"):
        queue_set_from_objects([obj("a"), obj("b", parent="a"), obj("c", parent="b")])
    with pytest.raises(QueueError, match=r"GPUQueue org: spec.namespaceSelector.*leaf queues"):
        queue_set_from_objects([obj("org", namespaceSelector={}), obj("t", parent="org")])
    with pytest.raises(QueueError, match=r"GPUQueue org: spec.default='true'.*child queues"):
        queue_set_from_objects([obj("org", default=True), obj("t", parent="org")])
    with pytest.raises(QueueError, match=r"GPUQueue b: spec.default='true'.*a is already the default"):
        queue_set_from_objects([obj("a", default=True), obj("b", default=True)])
    with pytest.raises(QueueError, match=r"metadata.name='a'.*no other GPUQueue"):
        QueueSet([GPUQueue("a"), GPUQueue("a")])


def test_namespaces_no_queue_selects_go_to_the_default_queue():
    qs = QueueSet([GPUQueue("a", namespace_selector=LabelSelector((("team", "a"),)))])
    assert qs.default == IMPLICIT_DEFAULT
    assert qs[IMPLICIT_DEFAULT] == GPUQueue(IMPLICIT_DEFAULT, default=True)  # no quota: all of it borrowed
    assert qs.queue_of("ns-a", {"team": "a"}) == "a"
    assert qs.queue_of("ns-x", {"team": "x"}) == IMPLICIT_DEFAULT
    assert QueueSet([]).queue_of("any", {}) == IMPLICIT_DEFAULT  # no GPUQueue at all
    named = QueueSet([GPUQueue("default", (ProductQuota("any", 8),))])  # one named default is the default
    assert named.default == "default" and named["default"].quotas == (ProductQuota("any", 8),)


def test_a_namespace_two_queues_select_is_refused_naming_both():
    qs = QueueSet(
        [
            GPUQueue("a", namespace_selector=LabelSelector((("team", "a"),))),
            GPUQueue("b", namespace_selector=LabelSelector(())),  # {} selects every namespace
        ]
    )
    with pytest.raises(QueueError, match=r"namespace ns: metadata.labels=.*these select it: a, b"):
        qs.queue_of("ns", {"team": "a"})
    assert qs.queue_of("other", {"team": "z"}) == "b"


@pytest.mark.parametrize(
    "expr, labels, selected",
    [
        ({"key": "tier", "operator": "In", "values": ["prod"]}, {"tier": "prod"}, True),
        ({"key": "tier", "operator": "In", "values": ["prod"]}, {}, False),
        ({"key": "tier", "operator": "NotIn", "values": ["prod"]}, {}, True),
        ({"key": "tier", "operator": "NotIn", "values": ["prod"]}, {"tier": "prod"}, False),
        ({"key": "tier", "operator": "Exists"}, {"tier": ""}, True),
        ({"key": "tier", "operator": "DoesNotExist"}, {"tier": "x"}, False),
    ],
)
def test_selector_expressions_match_as_kubernetes_does(expr, labels, selected):
    q = queue_from_object(obj("q", namespaceSelector={"matchExpressions": [expr]}))
    assert q.namespace_selector is not None
    assert q.namespace_selector.matches(labels) is selected
