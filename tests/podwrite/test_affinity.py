import copy

from gpuledger.core.model import BindingMode
from gpuledger.podwrite.affinity import bind, with_node

MINE = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}


def _terms(affinity: dict) -> list:
    return affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_the_node_is_anded_into_every_required_term_and_the_rest_is_kept():
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity = {
        "podAntiAffinity": {"x": 1},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone, {}]}},
    }
    before = copy.deepcopy(affinity)
    out = with_node(affinity, "n1", "kubernetes.io/hostname")
    assert _terms(out) == [
        {"matchExpressions": [*zone["matchExpressions"], MINE]},
        {"matchExpressions": [MINE]},
    ]
    assert affinity == before and out["podAntiAffinity"] is affinity["podAntiAffinity"]
    assert with_node(out, "n1", "kubernetes.io/hostname") == out  # written once, whatever writes it again


def test_metadata_name_is_matched_as_a_field_and_anything_else_reads_as_no_affinity():
    field = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    for odd in (None, [], "x", {"nodeAffinity": "x"}):
        assert _terms(with_node(odd, "n1", "metadata.name")) == [{"matchFields": [field]}]


def test_the_binding_mode_says_whether_nodename_affinity_or_both_are_written():
    written = {}
    for mode in BindingMode:
        spec: dict = {}
        bind(spec, "n1", mode, "kubernetes.io/hostname")
        written[mode] = sorted(spec)
    assert written == {
        BindingMode.NODE_NAME: ["nodeName"],
        BindingMode.AFFINITY: ["affinity"],
        BindingMode.BOTH: ["affinity", "nodeName"],
    }
