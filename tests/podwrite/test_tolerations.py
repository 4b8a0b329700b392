from gpuledger.core.model import Taint
from gpuledger.podwrite.tolerations import entry_for, missing, read

GPU = Taint("gpu", "", "NoSchedule")
DEDICATED = Taint("dedicated", "ml", "NoExecute")


def test_an_entry_is_written_for_each_taint_not_yet_tolerated_and_once():
    assert missing([], [GPU, DEDICATED, GPU]) == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
    ]
    assert missing([{"operator": "Exists"}], [GPU, DEDICATED]) == []  # tolerates everything
    assert missing([{"key": "gpu", "effect": "NoExecute", "operator": "Exists"}], [GPU]) == [entry_for(GPU)]
    assert missing([{"key": "dedicated", "value": "ml"}], [DEDICATED]) == []  # no operator: Equal


def test_an_entry_that_tolerates_nothing_reads_as_none():
    assert read("x") is None and read({"key": "gpu", "operator": "exists"}) is None
    assert missing([{"key": "gpu", "operator": "Foo"}], [GPU]) == [entry_for(GPU)]
    held = read({"key": "gpu"})
    assert held is not None and held.operator == "Equal" and held.value == "" and held.effect == ""


def test_a_taint_without_effect_gets_an_entry_without_one():
    assert entry_for(Taint("k", "v", "")) == {"key": "k", "operator": "Equal", "value": "v"}
