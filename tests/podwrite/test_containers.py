from gpuledger.podwrite.containers import ensure_gpu_limits, gpu_containers, others, set_env, set_env_of

GPU = "nvidia.com/gpu"


def _pod(*containers: dict, init: tuple = ()) -> dict:
    return {"spec": {"initContainers": list(init), "containers": list(containers)}}


def test_the_devices_go_to_the_containers_asking_for_them_else_to_every_container():
    asks = {"name": "a", "resources": {"limits": {GPU: 1}}}
    zero = {"name": "z", "resources": {"requests": {GPU: "0"}}}
    assert gpu_containers(_pod(zero, asks), GPU) == [("containers", 1)]
    assert gpu_containers(_pod(zero, {"name": "b"}, init=({"name": "i"},)), GPU) == [
        ("initContainers", 0),
        ("containers", 0),
        ("containers", 1),
    ]
    assert others(_pod(zero, asks)["spec"], [("containers", 1)]) == [("containers", 0)]


def test_the_variables_written_replace_the_users_and_none_removes_one():
    c = {"env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "7"}, {"name": "HOME", "value": "/"}]}
    set_env(c, {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": None, "X": {"fieldRef": {}}})
    assert c["env"] == [
        {"name": "HOME", "value": "/"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
        {"name": "X", "valueFrom": {"fieldRef": {}}},
    ]
    bare: dict = {}
    set_env(bare, {"NVIDIA_VISIBLE_DEVICES": None})
    assert bare == {}  # no empty env where there was none


def test_writing_copies_each_container_first():
    pod = _pod({"name": "a"})
    spec = dict(pod["spec"])
    set_env_of(spec, [("containers", 0)], {"V": "1"})
    assert pod["spec"]["containers"] == [{"name": "a"}]
    assert spec["containers"] == [{"name": "a", "env": [{"name": "V", "value": "1"}]}]


def test_gpu_limits_are_asked_for_on_container_0_only_when_no_container_names_the_resource():
    spec = _pod({"name": "a"}, {"name": "b"})["spec"]
    ensure_gpu_limits(spec, GPU, 2)
    assert spec["containers"][0] == {"name": "a", "resources": {"limits": {GPU: "2"}}}
    named = _pod({"name": "a"}, init=({"name": "i", "resources": {"requests": {GPU: 1}}},))["spec"]
    ensure_gpu_limits(named, GPU, 2)
    ensure_gpu_limits(spec, GPU, 0)
    assert named["containers"] == [{"name": "a"}]
