"""Properties of the parsers: no text crashes them, every refusal names its annotation, foreign digits are
never numbers (counts, memory, priorities, bandwidths, map indices and devices, pod indices, quantities), and
the earlier tools' forms (priority words, memory quantities, bandwidths, indices from names) read exactly."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.pods import objects as kube
from gpuledger.core.pods import placement_codec, quantity
from gpuledger.core.pods.annotation_values import (
    ANNOTATIONS,
    PRIORITY_WORDS,
    AnnotationError,
    scheduling_map_index,
)
from gpuledger.core.pods.request import request_from_pod
from gpuledger.names import (
    GPU_COUNT,
    GPU_MEMORY,
    GPU_MILLI,
    NETWORK_BANDWIDTH,
    PRIORITY,
    SCHEDULING_MAP,
    SCHEDULING_MAP_ALIAS,
)
from tests.core.core_factory import node

# any value a YAML author (or a fuzzer) could put in an annotation or a quantity field
texts = st.text(max_size=40) | st.sampled_from(
    [
        "",
        "0",
        "1",
        "2",
        "-1",
        "1.5",
        "1e3",
        "1e999",
        "1e1000",
        "16Gi",
        "100Gb",
        "high",
        "true",
        "0=n:0",
        "0=n:0,1\n1=m:2",
        "٢",
        "２",  # noqa: RUF001 - look-alike digits on purpose
        "१",
        "１０２４",  # noqa: RUF001 - look-alike digits on purpose
        "0=leaf-0-node-0:٣",
        "٣=n:0",
        "\u00a0",
        "[" * 50,
    ]
)
values = (
    texts | st.integers(-(2**70), 2**70) | st.floats() | st.booleans() | st.none() | st.lists(st.integers())
)


def _is_foreign_digit(c: str) -> bool:
    return not c.isascii()


# every Unicode decimal digit that is not 0-9: Arabic-Indic, fullwidth, Devanagari, Bengali, Thai, ...
foreign_digit = st.characters(categories=["Nd"]).filter(_is_foreign_digit)
# a number with at least one foreign digit among ASCII ones ("1٠", "٢", "１０２４")  # noqa: RUF003
foreign_number = (
    st.lists(st.sampled_from("0123456789") | foreign_digit, min_size=0, max_size=4)
    .flatmap(lambda digits: st.tuples(st.just(digits), foreign_digit, st.integers(0, len(digits))))
    .map(lambda t: "".join(t[0][: t[2]]) + t[1] + "".join(t[0][t[2] :]))
)


def pod(annotations: dict, labels: dict | None = None, name: str = "p") -> dict:
    return {
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
    }


# ------------------------------------------------------------------------------------- nothing crashes


@settings(max_examples=400, deadline=None)
@given(value=values)
def test_quantity_parser_raises_only_quantity_errors(value):
    try:
        result = quantity.parse_quantity(value)
    except quantity.QuantityError as err:
        assert repr(value) in str(err) and "ASCII" in str(err)
        return
    assert result.denominator >= 1
    if isinstance(value, str):
        assert value.strip().isascii()


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), value=values, label=values, devices=values)
def test_node_parser_never_raises_and_reports_what_it_ignored(field, value, label, devices):
    obj = node("n1", 2)
    obj["status"]["allocatable"][field] = value
    obj["metadata"]["labels"][kube.GPU_MEMORY_LABEL] = label
    obj["metadata"]["annotations"][kube.DEVICES_ANNOTATION] = devices
    problems: list[str] = []
    info = kube.node_from_object(obj, None, problems)
    assert info.name == "n1"
    assert all(p.startswith("node n1 ") for p in problems)


@settings(max_examples=300, deadline=None)
@given(text=values, key=st.sampled_from([b"", b"k"]))
def test_placement_decoder_never_raises(text, key):
    assert placement_codec.decode_placement(text, key) is None or isinstance(text, str)


@settings(max_examples=600, deadline=None)
@given(annotation=st.sampled_from(ANNOTATIONS), value=texts, base_count=st.sampled_from([None, "1"]))
def test_every_refused_annotation_value_is_named_in_the_denial(annotation, value, base_count):
    annotations = {} if base_count is None or annotation == GPU_COUNT else {GPU_COUNT: base_count}
    annotations[annotation] = value
    try:
        request_from_pod(pod(annotations), None, None, "rid")
    except AnnotationError as err:
        text = str(err)
        assert err.annotation == annotation, text
        assert annotation in text and "expected" in text and err.accepted in text


# ------------------------------------------------------------------------------------- foreign digits


def _refused(annotations: dict, named: str, labels: dict | None = None) -> AnnotationError:
    with pytest.raises(AnnotationError) as err:
        request_from_pod(pod(annotations, labels), None, None, "rid")
    assert err.value.annotation == named and named in str(err.value)
    return err.value


@settings(max_examples=150, deadline=None)
@given(number=foreign_number)
def test_foreign_digits_are_never_a_gpu_count_memory_milli_or_priority(number):
    _refused({GPU_COUNT: number}, GPU_COUNT)
    _refused({GPU_COUNT: "1", GPU_MEMORY: number}, GPU_MEMORY)
    _refused({GPU_COUNT: "1", GPU_MEMORY: number + "Mi"}, GPU_MEMORY)
    _refused({GPU_MILLI: number}, GPU_MILLI)
    _refused({GPU_COUNT: "1", PRIORITY: number}, PRIORITY)
    _refused({GPU_COUNT: "1", PRIORITY: "-" + number}, PRIORITY)
    _refused({GPU_COUNT: "1", NETWORK_BANDWIDTH: number + "Gb"}, NETWORK_BANDWIDTH)


@settings(max_examples=150, deadline=None)
@given(number=foreign_number, key=st.sampled_from([SCHEDULING_MAP, SCHEDULING_MAP_ALIAS]))
def test_foreign_digits_are_never_a_map_index_or_device(number, key):
    _refused({key: f"{number}=leaf-0-node-0:0"}, key)
    _refused({key: f"0=leaf-0-node-0:{number}"}, key)
    _refused({key: f"0=leaf-0-node-0:0,{number}"}, key)
    _refused(
        {key: "0=n:0\n1=n:1"}, "apps.kubernetes.io/pod-index", labels={"apps.kubernetes.io/pod-index": number}
    )
    assert scheduling_map_index({"metadata": {"name": f"gpu-test-{number}"}}) == 0  # not an index: entry 0


@settings(max_examples=150, deadline=None)
@given(number=foreign_number, suffix=st.sampled_from(["", "m", "Mi", "Gi", "e3", ".5"]))
def test_foreign_digits_are_never_a_quantity(number, suffix):
    with pytest.raises(quantity.QuantityError):
        quantity.parse_quantity(number + suffix)
    p = pod({GPU_COUNT: "1"})
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": number + suffix}
    with pytest.raises(AnnotationError) as err:
        request_from_pod(p, None, None, "rid")
    assert err.value.annotation == "spec.containers[0].resources.limits[nvidia.com/gpu]"


@pytest.mark.parametrize(
    "annotations,named",
    [
        ({GPU_COUNT: "٢"}, GPU_COUNT),
        ({GPU_COUNT: "２"}, GPU_COUNT),  # noqa: RUF001 - look-alike digits on purpose
        ({GPU_COUNT: "1", GPU_MEMORY: "１０２４"}, GPU_MEMORY),  # noqa: RUF001 - look-alike digits on purpose
        ({SCHEDULING_MAP: "0=leaf-0-node-0:٣"}, SCHEDULING_MAP),
        ({GPU_COUNT: "1", PRIORITY: "१०"}, PRIORITY),
    ],
)
def test_the_reported_examples_are_denied_with_the_annotation_and_value(annotations, named):
    err = _refused(annotations, named)
    assert repr(annotations[named]) in str(err) and "expected" in str(err)


# ------------------------------------------------------------------------------- the earlier tools' forms


def _request(annotations: dict, name: str = "p"):
    return request_from_pod(pod({GPU_COUNT: "1", **annotations}, name=name), None, None, "rid")


@settings(max_examples=200, deadline=None)
@given(
    value=st.integers(-(2**31), 2**31 - 1) | st.sampled_from(list(PRIORITY_WORDS)),
    upper=st.booleans(),
    pad=st.sampled_from(["", " ", "\t"]),
)
def test_priority_is_an_integer_or_a_word_of_the_table(value, upper, pad):
    text = str(value).upper() if upper else str(value)
    expected = PRIORITY_WORDS[value] if isinstance(value, str) else value
    assert _request({PRIORITY: pad + text + pad}).priority == expected


@settings(max_examples=300, deadline=None)
@given(
    number=st.integers(0, 10**8) | st.decimals(0, 10**6, places=3).map(str),
    suffix=st.sampled_from(["k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"]),
)
def test_memory_quantities_are_bytes_rounded_up_to_whole_mib(number, suffix):
    text = f"{number}{suffix}"
    mib = math.ceil(Fraction(str(number)) * quantity.SUFFIXES[suffix] / quantity.MIB)
    if 1 <= mib <= 10**7:
        assert _request({GPU_MEMORY: text}).gpu_memory_mib == mib
    else:
        _refused({GPU_COUNT: "1", GPU_MEMORY: text}, GPU_MEMORY)


@settings(max_examples=300, deadline=None)
@given(
    whole=st.integers(0, 10**6),
    tenths=st.integers(0, 9),
    prefix=st.sampled_from("kKmMgGtT"),
    unit=st.sampled_from(["", "b", "bps", "bit/s"]),
    space=st.sampled_from(["", " "]),
)
def test_bandwidths_are_gbit_per_second(whole, tenths, prefix, unit, space):
    text = f"{whole}.{tenths}{space}{prefix}{unit}"
    gbps = (Fraction(whole) + Fraction(tenths, 10)) * {
        "k": Fraction(1, 10**6),
        "m": Fraction(1, 1000),
        "g": 1,
        "t": 1000,
    }[prefix.lower()]
    if gbps > 0:
        r = _request({NETWORK_BANDWIDTH: text})
        assert (r.network_bandwidth, r.network_bandwidth_gbps) == (None, float(gbps))
    else:
        _refused({GPU_COUNT: "1", NETWORK_BANDWIDTH: text}, NETWORK_BANDWIDTH)


@settings(max_examples=200, deadline=None)
@given(
    stem=st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
    index=st.integers(0, 10**6),
    labelled=st.none() | st.integers(0, 10**6),
)
def test_map_index_is_the_label_else_the_trailing_number_of_the_name(stem, index, labelled):
    labels = {} if labelled is None else {"apps.kubernetes.io/pod-index": str(labelled)}
    p = {"metadata": {"name": f"{stem}-{index}", "labels": labels}}
    assert scheduling_map_index(p) == (index if labelled is None else labelled)
