from gpuledger.podwrite.visibility import host_indices


def test_the_runtime_shows_every_gpu_and_cuda_names_the_physical_indices():
    assert host_indices.placed([3, 1], ["GPU-3", "GPU-1"]) == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "CUDA_VISIBLE_DEVICES": "3,1",
    }
    assert host_indices.waiting(2) == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "CUDA_VISIBLE_DEVICES": host_indices.DEVICE_INDICES_FROM,
    }
    assert host_indices.MODE.others is None and not host_indices.MODE.kubelet_picks
