from gpuledger.names import SCHEDULING_GATE
from gpuledger.podwrite.gate import index_of, is_ours


def test_gpuledgers_gate_is_found_among_the_others():
    gates = [{"name": "other.io/g"}, {"name": SCHEDULING_GATE}]
    assert index_of({"spec": {"schedulingGates": gates}}) == 1
    assert index_of({"spec": {"schedulingGates": gates[:1]}}) is None
    assert index_of({"spec": None}) is None and index_of({}) is None
    assert is_ours({"name": SCHEDULING_GATE}) and not is_ours(SCHEDULING_GATE)
