import copy

import jsonpatch

from gpuledger.podwrite.copy_on_write import container, copied, shallow_pod
from gpuledger.podwrite.diff import patch_of


def _pod() -> dict:
    return {
        "metadata": {"annotations": {"a/b": "1", "gone": "x"}, "labels": {"l": "1"}},
        "spec": {"containers": [{"name": "c", "env": [{"name": "A", "value": "1"}]}], "nodeName": "old"},
    }


def test_the_ops_turn_the_pod_into_its_copy_and_name_only_what_changed():
    pod = _pod()
    original = copy.deepcopy(pod)
    work = shallow_pod(pod)
    annotations = copied(work["metadata"], "annotations")
    annotations["a/b"] = "2"
    del annotations["gone"]
    work["spec"]["nodeName"] = "new"
    work["spec"]["tolerations"] = [{"operator": "Exists"}]
    container(work["spec"], "containers", 0)["env"] = []
    ops = patch_of(pod, work)
    assert {(op["op"], op["path"]) for op in ops} == {
        ("remove", "/metadata/annotations/gone"),
        ("replace", "/metadata/annotations/a~1b"),
        ("replace", "/spec/nodeName"),
        ("add", "/spec/tolerations"),
        ("replace", "/spec/containers/0/env"),
    }
    assert pod == original and jsonpatch.apply_patch(pod, ops) == work


def test_writing_the_same_again_gives_no_ops():
    pod = _pod()
    work = shallow_pod(pod)
    copied(work["metadata"], "labels")["l"] = "1"
    container(work["spec"], "containers", 0)
    assert patch_of(pod, work) == [] and patch_of(pod, pod) == []
