"""ResourceSlices read into the GPUs each node's DRA driver publishes: the parser
(gpuledger.core.pods.resource_slices), the per-node table (gpuledger.core.nodes.published_gpus), and the
ledger that recognises such nodes, explains them in its denials and rebuilds them from the objects."""

from __future__ import annotations

import copy

import pytest

from gpuledger.core.ledger import Ledger
from gpuledger.core.model import Denial, Placement, Request
from gpuledger.core.nodes.published_gpus import PublishedSlices
from gpuledger.core.pods.request import request_from_pod
from gpuledger.core.pods.resource_slices import read_slice
from tests.core.core_factory import node, pod


def gpu_device(index: int, product: str = "NVIDIA H100 80GB HBM3", memory: str = "80Gi", type: str = "gpu"):
    """A device as NVIDIA's GPU DRA driver publishes it (cmd/gpu-kubelet-plugin/deviceinfo.go)."""
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": type},
            "uuid": {"string": f"GPU-{index:08d}-0000-0000-0000-000000000000"},
            "minor": {"int": index},
            "index": {"int": index},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "pcieBusID": {"string": f"0000:{index:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def gpu_slice(
    name: str,
    node_name: str | None = "dra-1",
    gpus: int = 2,
    *,
    driver: str = "gpu.nvidia.com",
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    first: int = 0,
    **spec,
) -> dict:
    body: dict = {
        "driver": driver,
        "pool": {
            "name": pool or node_name or "shared",
            "generation": generation,
            "resourceSliceCount": count,
        },
        "devices": [gpu_device(i) for i in range(first, first + gpus)],
        **spec,
    }
    if node_name is not None:
        body["nodeName"] = node_name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": body,
    }


def table(*slices: dict) -> PublishedSlices:
    out = PublishedSlices()
    for obj in slices:
        out.apply(read_slice(obj))
    return out


def dra_node(name: str = "dra-1") -> dict:
    """A node with no nvidia.com/gpu in its allocatable: its GPUs are the DRA driver's."""
    obj = node(name, gpus=0, product="", gpu_memory=None, leaf="l-dra")
    del obj["status"]["allocatable"]["nvidia.com/gpu"]
    return obj


# ----------------------------------------------------------------------------------------------- the parser
def test_a_device_is_read_with_the_nvidia_drivers_attributes_and_memory_capacity():
    read = read_slice(gpu_slice("dra-1-gpus", gpus=1))
    assert (read.name, read.driver, read.pool, read.generation, read.slice_count, read.node) == (
        "dra-1-gpus",
        "gpu.nvidia.com",
        "dra-1",
        1,
        1,
        "dra-1",
    )
    assert read.problems == ()
    (device,) = read.devices
    assert (device.name, device.type, device.product, device.memory_mib) == (
        "gpu-0",
        "gpu",
        "NVIDIA H100 80GB HBM3",
        80 * 1024,
    )
    assert device.uuid.startswith("GPU-")
    attributes = dict(device.attributes)
    assert set(attributes) == {
        "type",
        "uuid",
        "minor",
        "index",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "pcieBusID",
        "resource.kubernetes.io/pcieRoot",
    }
    assert attributes["cudaComputeCapability"] == "9.0.0" and attributes["index"] == "0"


def test_an_attribute_qualified_by_the_drivers_own_domain_is_the_same_attribute():
    obj = gpu_slice("s", gpus=1)
    attributes = obj["spec"]["devices"][0]["attributes"]
    attributes["gpu.nvidia.com/productName"] = attributes.pop("productName")
    assert read_slice(obj).devices[0].product == "NVIDIA H100 80GB HBM3"


def test_mig_devices_are_read_but_are_not_whole_gpus():
    obj = gpu_slice("s", gpus=1)
    obj["spec"]["devices"].append(dict(gpu_device(7, type="mig"), name="gpu-0-mig-9-4-4"))
    read = read_slice(obj)
    assert [d.is_gpu for d in read.devices] == [True, False]
    assert table(obj).by_node()["dra-1"].gpus == 1


# --------------------------------------------------------------------------------- pools and their slices
def test_only_the_newest_generation_of_a_pool_counts():
    old = gpu_slice("dra-1-old", gpus=4, generation=1)
    new = gpu_slice("dra-1-new", gpus=2, generation=2)
    assert table(old, new).by_node()["dra-1"].gpus == 2
    assert table(new, old).by_node()["dra-1"].gpus == 2  # the order seen does not matter
    published = table(old, new)
    published.delete("dra-1-new")
    assert published.by_node()["dra-1"].gpus == 4  # the older generation is all that is left


def test_a_pool_of_several_slices_counts_them_all_and_says_when_one_is_missing():
    first = gpu_slice("dra-1-a", gpus=2, count=2)
    second = gpu_slice("dra-1-b", gpus=2, count=2, first=2)
    whole = table(first, second).by_node()["dra-1"]
    assert whole.gpus == 4 and whole.incomplete == ()
    assert [d.name for d in whole.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    partial = table(first).by_node()["dra-1"]
    assert partial.gpus == 2
    assert partial.incomplete == ("gpu.nvidia.com/dra-1: 1 of 2 slices",)
    assert "incomplete pool gpu.nvidia.com/dra-1: 1 of 2 slices" in partial.describe()


@pytest.mark.parametrize(
    "spec",
    [
        {"nodeSelector": {"nodeSelectorTerms": [{"matchLabels": {"rack": "r1"}}]}},
        {"allNodes": True},
    ],
)
def test_slices_that_are_not_node_local_count_for_no_node(spec):
    obj = gpu_slice("network-attached", node_name=None, pool="fabric", **spec)
    read = read_slice(obj)
    assert read.node == "" and read.problems == ()
    assert table(obj).by_node() == {}


def test_a_slice_selecting_nodes_per_device_counts_for_no_node():
    obj = gpu_slice("per-device", node_name=None, pool="fabric", perDeviceNodeSelection=True)
    for device in obj["spec"]["devices"]:
        device["nodeName"] = "dra-1"
    assert table(obj).by_node() == {}


def test_other_drivers_are_ignored():
    nic = gpu_slice("dra-1-nic", driver="dra.net", gpus=2)
    read = read_slice(nic)
    assert read.devices == () and read.problems == ()
    published = table(nic)
    assert published.by_node() == {} and not published


def test_a_node_with_two_pools_names_both_drivers_products():
    a = gpu_slice("dra-1-a", gpus=1, pool="dra-1-a")
    b = gpu_slice("dra-1-b", gpus=1, pool="dra-1-b")
    b["spec"]["devices"][0] = gpu_device(1, product="NVIDIA A100-SXM4-40GB", memory="40Gi")
    gpus = table(a, b).by_node()["dra-1"]
    assert gpus.products == (("NVIDIA A100-SXM4-40GB", 1), ("NVIDIA H100 80GB HBM3", 1))
    assert gpus.describe() == "1x NVIDIA A100-SXM4-40GB, 1x NVIDIA H100 80GB HBM3 (driver gpu.nvidia.com)"


# ----------------------------------------------------------------------------------------------- bad input
def _mangled(path: tuple, value) -> dict:
    obj = gpu_slice("bad", gpus=2)
    at = obj
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("metadata", "name"), None, "metadata.name"),
        (("spec", "driver"), 7, "spec.driver"),
        (("spec", "pool"), "dra-1", "spec.pool.name"),
        (("spec", "pool", "name"), "", "spec.pool.name"),
        (("spec", "pool", "generation"), "one", "spec.pool.generation"),
        (("spec", "pool", "resourceSliceCount"), -1, "spec.pool.resourceSliceCount"),
        (("spec", "nodeName"), 5, "spec.nodeName"),
        (("spec", "devices"), {"gpu-0": {}}, "spec.devices"),
        (("spec", "devices", 0), "gpu-0", "spec.devices[0]"),
        (("spec", "devices", 0, "name"), "", "spec.devices[0].name"),
        (("spec", "devices", 0, "attributes"), ["type"], "spec.devices[0] (gpu-0).attributes"),
        (("spec", "devices", 0, "attributes", "type"), {"string": None, "float": 1.5}, "attributes[type]"),
        (("spec", "devices", 0, "attributes", "index"), {"int": True}, "attributes[index]"),
        (("spec", "devices", 0, "capacity"), "80Gi", "spec.devices[0] (gpu-0).capacity"),
        (("spec", "devices", 0, "capacity", "memory"), {"value": "eighty"}, "capacity[memory]"),
        (("spec", "devices", 0, "capacity", "memory"), "80Gi", "capacity[memory]"),
    ],
)
def test_a_malformed_field_is_left_out_with_a_reason_naming_it(path, value, named):
    read = read_slice(_mangled(path, value))
    assert read.problems, read
    assert any(named in p for p in read.problems), read.problems
    assert any(str(value) in p or repr(value) in p for p in read.problems), read.problems
    table(_mangled(path, value)).by_node()  # and the table takes it


@pytest.mark.parametrize("obj", [None, [], "slice", {}, {"metadata": "x", "spec": 1}, {"spec": {"pool": {}}}])
def test_an_object_that_is_no_slice_at_all_is_unusable_not_fatal(obj):
    read = read_slice(obj)
    assert not read.usable and read.problems
    assert table(obj).by_node() == {} if isinstance(obj, dict) else True


# ------------------------------------------------------------------------------------------------ the ledger
def _cluster(*extra: dict) -> list[dict]:
    return [node("plugin-1", gpus=4), dra_node("dra-1"), *extra]


def test_the_ledger_marks_a_node_whose_gpus_are_published_through_dra():
    led = Ledger.rebuild(_cluster(gpu_slice("dra-1-gpus", gpus=8)))
    (gpus,) = led.dra_nodes()
    assert (gpus.node, gpus.gpus, gpus.drivers) == ("dra-1", 8, ("gpu.nvidia.com",))
    assert gpus.products == (("NVIDIA H100 80GB HBM3", 8),)


def test_a_node_with_device_plugin_gpus_keeps_its_count_and_is_not_marked():
    both = node("both-1", gpus=4)
    led = Ledger.rebuild([both, gpu_slice("both-1-gpus", node_name="both-1", gpus=8)])
    assert led.dra_nodes() == []
    assert led.index.nodes["both-1"].info.devices and len(led.index.nodes["both-1"].info.devices) == 4


def test_a_slice_for_a_node_the_ledger_does_not_know_marks_nothing():
    led = Ledger.rebuild(_cluster(gpu_slice("ghost-gpus", node_name="ghost", gpus=8)))
    assert led.dra_nodes() == []


def test_a_gpu_pod_that_only_such_a_node_could_take_is_denied_naming_dra_and_what_to_do():
    led = Ledger.rebuild(_cluster(gpu_slice("dra-1-gpus", gpus=8)))
    answer = led.reserve(Request(id="big", gpus=8), 0.0)
    assert isinstance(answer, Denial)
    message = answer.message
    assert (
        "1 node(s) have GPUs published through DRA (dra-1: 8x NVIDIA H100 80GB HBM3 (driver gpu.nvidia.com))"
        in (message)
    )
    assert "gpuledger places device-plugin GPUs (nvidia.com/gpu) until its DRA mode" in message
    assert "ResourceClaim (spec.resourceClaims, a DeviceClass of driver gpu.nvidia.com)" in message
    # a pod that fits elsewhere is placed as before, and the explanation of one that does not says it too
    assert isinstance(led.reserve(Request(id="small", gpus=2), 0.0), Placement)
    explained = led.explain(Request(id="big2", gpus=8)).result
    assert isinstance(explained, Denial) and "published through DRA" in explained.message


def test_a_pod_without_gpus_is_not_told_about_dra():
    led = Ledger.rebuild([dra_node("dra-1"), gpu_slice("dra-1-gpus", gpus=8)])
    answer = led.reserve(Request(id="cpu", cpu_milli=10**9), 0.0)
    assert isinstance(answer, Denial) and "DRA" not in answer.message


def test_the_slice_deleted_the_node_no_longer_has_dra_gpus():
    slice_obj = gpu_slice("dra-1-gpus", gpus=8)
    led = Ledger.rebuild(_cluster())
    led.apply_object(slice_obj, 0.0)
    assert [g.node for g in led.dra_nodes()] == ["dra-1"]
    led.delete_object(slice_obj)
    assert led.dra_nodes() == []
    answer = led.reserve(Request(id="big", gpus=8), 0.0)
    assert isinstance(answer, Denial) and "DRA" not in answer.message


def test_rebuilt_equals_live_with_slices():
    objects = _cluster(
        gpu_slice("dra-1-old", gpus=4, generation=1),
        pod("p", node_name="plugin-1", gpus=1),
    )
    live = Ledger.rebuild(objects)
    newer = gpu_slice("dra-1-new", gpus=2, generation=2, count=2)
    other = gpu_slice("dra-1-new-b", gpus=2, generation=2, count=2, first=2)
    for obj in (newer, other):
        live.apply_object(copy.deepcopy(obj), 0.0)
    live.delete_object(objects[2])
    rebuilt = Ledger.rebuild([o for o in objects if o is not objects[2]] + [newer, other])
    assert live.snapshot() == rebuilt.snapshot()
    assert "resource_slices" in live.snapshot()
    assert [g.gpus for g in rebuilt.dra_nodes()] == [4]


def test_a_malformed_slice_is_a_problem_of_the_ledger_not_a_failure():
    bad = gpu_slice("bad", gpus=1)
    bad["spec"]["devices"][0]["capacity"]["memory"] = {"value": "lots"}
    led = Ledger.rebuild(_cluster(bad))
    assert any("capacity[memory]" in p for p in led.problems)
    assert led.dra_nodes()[0].devices[0].memory_mib == 0


def test_a_pod_asking_for_gpus_through_a_resource_claim_only_is_not_gpuledgers():
    """What the denial tells the user to do: such a pod needs no placement by gpuledger."""
    obj = pod("claims", gpus=0)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    assert request_from_pod(obj, None) is None
