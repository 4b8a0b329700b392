import pytest

from gpuledger.core.model import DeviceShare, Placement, Request
from gpuledger.podwrite import visibility
from gpuledger.webhook.config import VISIBILITY_MODES

GPU = "nvidia.com/gpu"


def test_every_mode_the_webhook_accepts_has_its_module_and_no_other():
    assert tuple(visibility.MODES) == VISIBILITY_MODES
    with pytest.raises(KeyError):
        visibility.mode("dra")


def test_a_placement_counts_its_shared_devices_after_its_own():
    placement = Placement("r", "n", devices=(3,), shares=(DeviceShare(5, 500),))
    assert visibility.placed_env(placement, "host-indices")["CUDA_VISIBLE_DEVICES"] == "3,5"


def test_a_shared_request_waits_for_one_device():
    shared = Request("q", gpu_milli=250)
    assert visibility.waiting_env(shared, "runtime-uuids")["CUDA_VISIBLE_DEVICES"] == "0"
    assert visibility.waiting_env(Request("q", gpus=2), "runtime-uuids")["CUDA_VISIBLE_DEVICES"] == "0,1"


def _pod() -> dict:
    return {"spec": {"containers": [{"name": "gpu", "resources": {"limits": {GPU: 1}}}, {"name": "side"}]}}


def test_runtime_uuids_void_the_other_containers():
    pod = _pod()
    visibility.write_placed(pod, Placement("r", "n", devices=(2,), uuids=("GPU-2",)), "runtime-uuids", GPU)
    gpu, side = pod["spec"]["containers"]
    assert gpu["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-2"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
    ]
    assert side["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_device_plugin_asks_the_kubelet_for_the_devices_of_a_count_from_annotations():
    pod = {
        "spec": {"containers": [{"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}
    }
    visibility.write_waiting(pod, Request("q", gpus=2), "device-plugin", GPU)
    assert pod["spec"]["containers"] == [{"name": "c", "env": [], "resources": {"limits": {GPU: "2"}}}]
