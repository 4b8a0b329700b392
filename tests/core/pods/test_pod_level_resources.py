"""Pod-level resources (`spec.resources`, beta since Kubernetes 1.34 and on by default): the pod's own CPU and
memory stand for its containers' where set, as kube-scheduler counts them; GPUs stay per container. The
request parser and the rebuild's count (`pod_requests`) agree, and a bad pod-level quantity is a denial
naming its field."""

from __future__ import annotations

import pytest

from gpuledger.core.pods.annotation_values import AnnotationError
from gpuledger.core.pods.objects import pod_requests
from gpuledger.core.pods.pod_spec import container_resources


def pod(level: dict | None = None, containers: int = 2, overhead: dict | None = None) -> dict:
    spec: dict = {
        "containers": [
            {
                "name": f"c{i}",
                "resources": {
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": "1"},
                },
            }
            for i in range(containers)
        ],
        "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}}],
    }
    if level is not None:
        spec["resources"] = level
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"name": "p"}, "spec": spec}


def both(obj: dict) -> tuple[int, int]:
    counted = pod_requests(obj)
    assert container_resources(obj) == (counted.cpu_milli, counted.memory_mib)  # parser and rebuild agree
    return counted.cpu_milli, counted.memory_mib


def test_without_pod_level_resources_the_containers_and_init_peak_count():
    assert both(pod()) == (3000, 2048)  # the init container's 3 CPUs peak; two containers' memory


def test_pod_level_requests_stand_for_the_containers():
    assert both(pod({"requests": {"cpu": "2", "memory": "4Gi"}})) == (2000, 4096)


def test_a_pod_level_limit_alone_is_its_request_and_one_resource_may_be_set_alone():
    assert both(pod({"limits": {"cpu": "6"}})) == (6000, 2048)  # memory from the containers
    assert both(pod({"requests": {"memory": "8Gi"}, "limits": {"memory": "16Gi"}})) == (3000, 8192)


def test_overhead_is_added_to_pod_level_resources():
    assert both(pod({"requests": {"cpu": "2"}}, overhead={"cpu": "250m", "memory": "64Mi"})) == (2250, 2112)


def test_gpus_stay_per_container():
    assert pod_requests(pod({"requests": {"cpu": "1"}}, containers=3)).gpus == 3


def test_a_bad_pod_level_quantity_is_a_denial_naming_its_field():
    with pytest.raises(AnnotationError) as err:
        container_resources(pod({"requests": {"cpu": "lots"}}))
    assert "spec.resources.requests.cpu" in str(err.value)


def test_an_odd_shaped_spec_resources_is_read_as_it_stands():
    """A non-map section reads as absent in the copy the parser counts, as the rebuild reads it."""
    obj = pod({"requests": ["cpu"]})
    assert container_resources(obj) == (3000, 2048)
    assert (pod_requests(obj).cpu_milli, pod_requests(obj).memory_mib) == (3000, 2048)
