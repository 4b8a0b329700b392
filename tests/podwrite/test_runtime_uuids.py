from gpuledger.podwrite.visibility import runtime_uuids


def test_the_runtime_mounts_the_placements_gpus_by_uuid_when_every_one_is_known():
    assert runtime_uuids.placed([3, 1], ["GPU-3", "GPU-1"]) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-3,GPU-1",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert runtime_uuids.placed([3, 1], ["GPU-3", ""])["NVIDIA_VISIBLE_DEVICES"] == "3,1"
    assert runtime_uuids.placed([3, 1], [])["NVIDIA_VISIBLE_DEVICES"] == "3,1"


def test_a_waiting_pod_reads_its_devices_from_the_annotation_its_placement_writes():
    assert runtime_uuids.waiting(2) == {
        "NVIDIA_VISIBLE_DEVICES": runtime_uuids.VISIBLE_DEVICES_FROM,
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert runtime_uuids.MODE.others == {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": None}
