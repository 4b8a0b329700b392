from gpuledger.podwrite.copy_on_write import container, copied, dict_at, list_at, shallow_pod


def test_members_of_the_wrong_type_read_as_empty():
    parent = {"a": [1], "m": {"k": 1}, "s": "x"}
    assert dict_at(parent, "m") == {"k": 1} and dict_at(parent, "a") == {} and dict_at(parent, "none") == {}
    assert list_at(parent, "a") == [1] and list_at(parent, "s") == []


def test_a_copy_is_written_in_place_and_the_original_is_left_alone():
    inner = {"k": 1}
    parent = {"m": inner}
    out = copied(parent, "m")
    out["k"] = 2
    assert parent["m"] is out and inner == {"k": 1}
    assert copied(parent, "new") == {} and parent["new"] == {}


def test_a_shallow_pod_shares_what_it_does_not_copy():
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}, "status": {}}
    work = shallow_pod(pod)
    assert work["metadata"] is not pod["metadata"] and work["spec"] is not pod["spec"]
    assert work["status"] is pod["status"] and work["spec"]["containers"] is pod["spec"]["containers"]
    c = container(work["spec"], "containers", 0)
    c["env"] = []
    assert pod["spec"]["containers"] == [{"name": "c"}] and work["spec"]["containers"] == [c]
    assert "spec" not in shallow_pod({"metadata": {}})
