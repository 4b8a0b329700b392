"""The one quantity parser: Kubernetes' grammar, ASCII digits only, a strict and a lenient policy."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from gpuledger.core.pods import objects as kube
from gpuledger.core.pods import placement_codec, quantity
from gpuledger.core.pods.annotation_values import AnnotationError
from gpuledger.core.pods.annotation_values import parse_quantity as read_quantity
from tests.core.core_factory import node

# digits that Python's int(), float(), Decimal() and re's \d all read as numbers
FOREIGN_TWO = [
    "٢",
    "２",  # noqa: RUF001 - look-alike digits on purpose
    "२",
    "۲",
    "২",
    "𝟐",  # noqa: RUF001 - look-alike digits on purpose
]  # Arabic-Indic, fullwidth, Devanagari, Persian, Bengali, math bold


@pytest.mark.parametrize(
    "text,value",
    [
        ("1.", Fraction(1)),
        (".5", Fraction(1, 2)),
        ("+2", Fraction(2)),
        ("-1", Fraction(-1)),
        (" 4Gi ", 4 * 2**30),
        ("1e-3", Fraction(1, 1000)),
        ("2E2", Fraction(200)),
        ("1.5Ki", Fraction(1536)),
        ("7Ei", 7 * 2**60),
        (0.25, Fraction(1, 4)),
        (1e20, Fraction(10**20)),
        (-3, Fraction(-3)),
    ],
)
def test_kubernetes_grammar(text, value):
    assert quantity.parse_quantity(text) == value


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "+",
        "e3",
        "1e3Gi",
        "1ee3",
        "1e1000",
        "1e99999999",
        "Gi",
        "1 Gi",
        "1gi",
        "0x10",
        "1_000",
        "inf",
        "nan",
        float("nan"),
        float("inf"),
        None,
        [],
        {},
        b"1",
        False,
        "1" * 5000,
    ]
    + FOREIGN_TWO
    + [f"{d}Gi" for d in FOREIGN_TWO]
    + ["1٠٠m", "１０２４Mi"],  # noqa: RUF001 - look-alike digits on purpose
)
def test_everything_else_is_a_quantity_error_naming_the_accepted_forms(bad):
    with pytest.raises(quantity.QuantityError) as err:
        quantity.parse_quantity(bad)
    assert "Gi" in str(err.value) and "ASCII" in str(err.value)


def test_exponents_are_bounded_so_a_huge_one_is_refused_not_computed():
    assert quantity.parse_quantity("1e999") == 10**999
    with pytest.raises(quantity.QuantityError):
        quantity.parse_quantity("1e1000")


def test_both_callers_share_the_one_parser():
    assert (
        quantity.parse_quantity is quantity.parse_quantity
        and quantity.QuantityError is quantity.QuantityError
    )
    for text in ("500m", "2Gi", "1e3", "1.", ".5", "128974848"):
        assert read_quantity("f", text) == quantity.parse_quantity(text)
    for text in ("1e3Gi", "٢", "lots", "-1"):
        with pytest.raises(AnnotationError) as err:
            read_quantity("spec.containers[0].resources.requests.cpu", text)
        assert err.value.annotation == "spec.containers[0].resources.requests.cpu"


def test_strict_reader_refuses_negative_quantities_the_lenient_one_records_nothing_for_them():
    with pytest.raises(AnnotationError, match="non-negative"):
        read_quantity("f", "-1")
    assert quantity.cpu_milli("-1") == -1000  # cluster objects: as before, the ledger reads what it is given


def test_lenient_policy_records_the_problem_and_returns_the_default():
    problems: list[str] = []
    assert quantity.parse_or_default(quantity.count, "٢", 0, problems, "node n nvidia.com/gpu") == 0
    assert problems == [f"node n nvidia.com/gpu: quantity '٢': expected {quantity.ACCEPTED}"]
    assert quantity.parse_or_default(quantity.count, None, 7, problems, "absent") == 7 and len(problems) == 1
    assert quantity.parse_or_default(quantity.count, "3", 0, None, "no list") == 3


@pytest.mark.parametrize("digit", FOREIGN_TWO)
def test_ascii_int_and_float_refuse_foreign_digits_that_python_accepts(digit):
    assert int(digit) == 2  # the trap
    with pytest.raises(ValueError, match="ASCII"):
        quantity.ascii_int(digit)
    with pytest.raises(ValueError, match="ASCII"):
        quantity.ascii_float(digit)
    assert (
        quantity.ascii_int(" 7 ") == 7 and quantity.ascii_int(3) == 3 and quantity.ascii_float("1.5") == 1.5
    )


def test_ascii_int_turns_overflow_into_a_value_error():
    with pytest.raises(ValueError):
        quantity.ascii_int(float("inf"))


@pytest.mark.parametrize(
    "field,value",
    [
        ("cpu", "٦٤"),
        ("memory", "５１２Gi"),  # noqa: RUF001 - look-alike digits on purpose
        ("nvidia.com/gpu", "८"),
    ],
)
def test_node_with_foreign_digits_keeps_its_other_fields_and_reports_the_bad_one(field, value):
    obj = node("n1", 4)
    obj["status"]["allocatable"][field] = value
    problems: list[str] = []
    info = kube.node_from_object(obj, None, problems)
    assert info.name == "n1" and len(problems) == 1 and field in problems[0] and repr(value) in problems[0]
    assert (info.cpu_milli, info.memory_mib, len(info.devices)) == {
        "cpu": (0, 512 * 1024, 4),
        "memory": (64000, 0, 4),
        "nvidia.com/gpu": (64000, 512 * 1024, 0),
    }[field]


def test_node_gpu_memory_label_and_device_annotation_take_ascii_digits_only():
    problems: list[str] = []
    info = kube.node_from_object(node("n", 2, gpu_memory="٤٠٩٦0"), None, problems)  # noqa: RUF001
    assert {d.memory_mib for d in info.devices} == {0} and kube.GPU_MEMORY_LABEL in problems[0]
    for devices in ([{"index": "٣"}], [{"index": 0, "memoryMiB": "８"}]):  # noqa: RUF001
        problems = []
        info = kube.node_from_object(node("n", 2, devices=devices), None, problems)
        assert [d.index for d in info.devices] == [0, 1]  # the annotation is ignored, allocatable stands
        assert kube.DEVICES_ANNOTATION in problems[0]


@pytest.mark.parametrize("text", ['[{"index": Infinity}]', '[{"index": NaN}]', "[" * 100_000])
def test_device_annotations_that_used_to_crash_the_node_parser_are_reported(text):
    obj = node("n", 2)
    obj["metadata"]["annotations"][kube.DEVICES_ANNOTATION] = text
    problems: list[str] = []
    assert len(kube.node_from_object(obj, None, problems).devices) == 2
    assert kube.DEVICES_ANNOTATION in problems[0]


def test_placements_with_foreign_digits_or_deep_nesting_do_not_decode():
    good = json.loads(
        placement_codec.encode_placement(
            placement_codec.placement_from_dict({"id": "r", "node": "n", "devices": [1]})
        )
    )
    assert placement_codec.decode_placement(json.dumps(good)).devices == (1,)
    for field, value in (("devices", ["٣"]), ("cpu", "１"), ("score", "١.٥"), ("cpu", float("inf"))):  # noqa: RUF001
        assert placement_codec.decode_placement(json.dumps({**good, field: value})) is None
    assert placement_codec.decode_placement("[" * 100_000) is None


def test_natural_key_reads_ascii_digits_only():
    assert sorted(["leaf-10", "leaf-٢", "leaf-2"], key=kube.natural_key) == ["leaf-2", "leaf-10", "leaf-٢"]
    assert kube.natural_key("a-²") == ((1, 0, "a-²"),)  # '²'.isdigit() is True but int('²') raises


@pytest.mark.parametrize("gpus", ["1e18", "5000", 2**70])
def test_an_absurd_gpu_count_is_reported_not_turned_into_device_records(gpus):
    obj = node("n", 2)
    obj["status"]["allocatable"]["nvidia.com/gpu"] = gpus
    problems: list[str] = []
    assert kube.node_from_object(obj, None, problems).devices == ()
    assert "at most 4096" in problems[0]
