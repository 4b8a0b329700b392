from gpuledger.podwrite.visibility import device_plugin


def test_the_kubelets_plugin_picks_and_the_pod_keeps_no_runtime_variable_of_its_own():
    assert device_plugin.placed([0], ["GPU-0"]) == {"NVIDIA_VISIBLE_DEVICES": None}
    assert device_plugin.waiting(1) == {"NVIDIA_VISIBLE_DEVICES": None}
    assert device_plugin.MODE.kubelet_picks and device_plugin.MODE.others is None
