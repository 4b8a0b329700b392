"""`dict_init` (Request, NodeInfo) gives what the dataclass's generated __init__ gives: the same fields,
defaults, errors, equality, hashing, frozenness, `replace` and pickling."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from gpuledger.core.model import GroupSpec, PinnedDevices, Request, Toleration
from gpuledger.core.slots_init import dict_init


def _reference(**given) -> dict:
    """The fields as the generated __init__ sets them: each default, then what was given."""
    return {f.name: given.get(f.name, f.default) for f in dataclasses.fields(Request)}


def test_fields_defaults_and_keywords():
    r = Request(id="a", gpus=2, strategy="best_fit", tolerations=(Toleration(key="k"),), seed=7)
    assert vars(r) == _reference(
        id="a", gpus=2, strategy="best_fit", tolerations=(Toleration(key="k"),), seed=7
    )
    assert list(vars(r)) == [
        f.name for f in dataclasses.fields(Request)
    ]  # field order, as dataclasses keep it


def test_every_field_positionally():
    values = [f"v{i}" for i, _ in enumerate(dataclasses.fields(Request))]
    r = Request(*values)
    assert [getattr(r, f.name) for f in dataclasses.fields(Request)] == values


def test_errors_equality_hash_frozen_replace_pickle():
    with pytest.raises(TypeError):
        Request()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Request(id="a", no_such_field=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Request("a", id="b")  # type: ignore[misc]
    r = Request(id="a", gpus=1, group=GroupSpec(key="job/ns/x", size=2), pinned=PinnedDevices("n1", (0,)))
    same = Request(id="a", gpus=1, group=GroupSpec(key="job/ns/x", size=2), pinned=PinnedDevices("n1", (0,)))
    assert r == same and hash(r) == hash(same) and r != Request(id="b", gpus=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.gpus = 3  # type: ignore[misc]
    moved = dataclasses.replace(r, id="c", seed=5)
    assert vars(moved) == {**vars(r), "id": "c", "seed": 5}
    assert pickle.loads(pickle.dumps(r)) == r
    assert repr(r).startswith("Request(id='a', gpus=1,")


def test_refuses_classes_it_does_not_fit():
    @dataclasses.dataclass
    class Mutable:
        x: int = 0

    @dataclasses.dataclass(frozen=True)
    class Factory:
        x: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        x: int = 0

    for cls in (Mutable, Factory, Slotted):
        with pytest.raises(TypeError):
            dict_init(cls)


def test_node_info_keeps_its_fields_defaults_and_methods():
    """NodeInfo (one per Node object read) is built by `dict_init` too."""
    from gpuledger.core.model import NodeInfo

    info = NodeInfo("n1", 1000, 2048, (), labels=(("a", "b"),), spine="s1")
    assert vars(info) == {
        f.name: {
            "name": "n1",
            "cpu_milli": 1000,
            "memory_mib": 2048,
            "devices": (),
            "labels": (("a", "b"),),
        }.get(f.name, "s1" if f.name == "spine" else f.default)
        for f in dataclasses.fields(NodeInfo)
    }
    assert info.label("a") == "b" and info.label_map == {"a": "b"}
    assert info == NodeInfo("n1", 1000, 2048, (), labels=(("a", "b"),), spine="s1")
    assert pickle.loads(pickle.dumps(info)) == info and dataclasses.replace(info, name="n2").spine == "s1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = "x"  # type: ignore[misc]
