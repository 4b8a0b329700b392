"""Device requests a pod sets itself, through the real aiohttp server over real TLS: /mutate denies them
before placing, /validate accepts exactly what the placement wrote, CUDA_VISIBLE_DEVICES replacements warn."""

from __future__ import annotations

import contextlib
import ssl

import aiohttp
import pytest

from gpuledger.certs.pki import make_ca, make_serving_cert, write_bundle
from gpuledger.webhook.admission.review import decode_patch, make_review
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.transport.app import create_app
from gpuledger.webhook.transport.server import start_server
from gpuledger.webhook.transport.tls import ReloadingTLS
from tests.webhook.webhook_support import Clock, apply_patch, cluster, config, gpu_pod, service

ACCEPTED = "ask for GPUs with resources.limits nvidia.com/gpu or the annotation topology.scheduler/gpu-count"


class Webhook:
    def __init__(self, url: str, session: aiohttp.ClientSession):
        self.url, self.session, self.uids = url, session, 0

    async def post(self, route: str, pod: dict, sub_resource: str = "", **kwargs) -> dict:
        self.uids += 1
        body = make_review(pod, uid=f"u{self.uids}", **kwargs)
        if sub_resource:
            body["request"]["subResource"] = sub_resource
        async with self.session.post(f"{self.url}/{route}", json=body) as resp:
            assert resp.status == 200
            return (await resp.json())["response"]

    async def admit(self, pod: dict) -> tuple[dict, dict]:
        """Mutate, then validate the patched pod, as the API server does; (mutate answer, stored pod)."""
        answer = await self.post("mutate", pod)
        assert answer["allowed"], answer
        stored = apply_patch(pod, decode_patch(answer))
        checked = await self.post("validate", stored)
        assert checked["allowed"], checked
        return answer, stored


@contextlib.asynccontextmanager
async def webhook(tmp_path, **cfg):
    ca = make_ca()
    paths = write_bundle(tmp_path, ca, make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
    tls = ReloadingTLS(paths["tls.crt"], paths["tls.key"], None, poll_interval_s=60)
    app = create_app(config(**cfg), InProcessLedgerClient(service(cluster(2, 8)), Clock()))
    server = await start_server(app, "127.0.0.1", 0, tls)
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            yield Webhook(server.url, session)
    finally:
        await server.stop()


def with_env(pod: dict, container: int = 0, **env) -> dict:
    c = pod["spec"]["containers"][container]
    c["env"] = [*c.get("env", []), *({"name": k, "value": v} for k, v in env.items())]
    return pod


def env_of(pod: dict, container: int = 0) -> dict:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][container].get("env", [])}


@pytest.mark.parametrize("mode", ["runtime-uuids", "host-indices", "device-plugin"])
async def test_a_pod_without_gpus_naming_all_gpus_is_denied_by_both_webhooks(tmp_path, mode):
    pod = with_env(gpu_pod(None, name="reader"), NVIDIA_VISIBLE_DEVICES="all")
    async with webhook(tmp_path, visibility_mode=mode) as hook:
        for route in ("mutate", "validate"):  # validate alone: as if the mutating webhook were bypassed
            answer = await hook.post(route, pod, namespace="ml")
            status = answer["status"]
            assert not answer["allowed"] and status["code"] == 403 and status["reason"] == "Forbidden"
            assert status["message"].startswith(
                'gpuledger: pod ml/reader: container "c0" sets '
                "spec.containers[0].env[NVIDIA_VISIBLE_DEVICES]='all'"
            )
            assert ACCEPTED in status["message"] and "patch" not in answer


async def test_a_gpu_pod_naming_other_devices_is_denied_before_anything_is_reserved(tmp_path):
    pod = with_env(gpu_pod(1, limits=True, containers=2), 1, NVIDIA_VISIBLE_DEVICES="GPU-someone-elses")
    async with webhook(tmp_path) as hook:
        answer = await hook.post("mutate", pod)
        assert not answer["allowed"]
        assert (
            "spec.containers[1].env[NVIDIA_VISIBLE_DEVICES]='GPU-someone-elses'"
            in answer["status"]["message"]
        )
        # nothing was reserved for it: a whole node's GPUs are still there for the next pod
        placed, _ = await hook.admit(gpu_pod(8, limits=True))
        assert placed["allowed"]


async def test_runtime_uuids_writes_pass_validation_and_reinvocation_and_tampering_does_not(tmp_path):
    async with webhook(tmp_path) as hook:
        pod = gpu_pod(2, limits=True, containers=2)
        answer = await hook.post("mutate", pod)
        stored = apply_patch(pod, decode_patch(answer))
        assert env_of(stored, 1) == {"NVIDIA_VISIBLE_DEVICES": "void"}
        assert env_of(stored, 0)["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
        assert not answer.get("warnings")
        again = await hook.post("mutate", stored)  # a reinvocation sees our own values: accepted, no change
        assert again["allowed"] and not decode_patch(again) and not again.get("warnings")
        assert (await hook.post("validate", stored))["allowed"]

        # a later mutation (another webhook) widening the devices: the validating webhook refuses it
        for container, value in ((0, "all"), (1, "GPU-x"), (0, "<ours>,GPU-y")):
            pod = gpu_pod(2, limits=True, containers=2)
            tampered = apply_patch(pod, decode_patch(await hook.post("mutate", pod)))
            for e in tampered["spec"]["containers"][container]["env"]:
                if e["name"] == "NVIDIA_VISIBLE_DEVICES":
                    value = e["value"] = value.replace("<ours>", e["value"])
            denied = await hook.post("validate", tampered)
            assert not denied["allowed"], value
            message = denied["status"]["message"]
            assert f"spec.containers[{container}].env[NVIDIA_VISIBLE_DEVICES]={value!r}" in message


async def test_cuda_visible_devices_replaced_by_the_placement_warns(tmp_path):
    async with webhook(tmp_path, visibility_mode="host-indices") as hook:
        pod = with_env(gpu_pod(2, limits=True, name="multi-gpu-worker"), CUDA_VISIBLE_DEVICES="7,6")
        with_env(pod, WORKER_TYPE="gpu")
        answer, stored = await hook.admit(pod)
        env = env_of(stored)
        assert env["WORKER_TYPE"] == "gpu" and env["NVIDIA_VISIBLE_DEVICES"] == "all"
        [warning] = answer["warnings"]
        assert warning == (
            "gpuledger replaced CUDA_VISIBLE_DEVICES=7,6 in container "
            f'"c0" with {env["CUDA_VISIBLE_DEVICES"]!r}: '
            "in visibility mode host-indices the placement sets it (it numbers the GPUs the container sees); "
            "docs/webhook.md"
        )


async def test_device_plugin_mode_keeps_the_users_cuda_visible_devices_without_a_warning(tmp_path):
    async with webhook(tmp_path, visibility_mode="device-plugin") as hook:
        pod = with_env(gpu_pod(2, limits=True), CUDA_VISIBLE_DEVICES="0,1")
        answer, stored = await hook.admit(pod)
        assert env_of(stored) == {"CUDA_VISIBLE_DEVICES": "0,1"} and not answer.get("warnings")


async def test_cdi_annotation_and_device_host_path_are_denied_on_mutate(tmp_path):
    async with webhook(tmp_path) as hook:
        cdi = gpu_pod(None, annotations={"cdi.k8s.io/all-gpus": "nvidia.com/gpu=all"})
        answer = await hook.post("mutate", cdi)
        assert (
            not answer["allowed"]
            and "annotation cdi.k8s.io/all-gpus='nvidia.com/gpu=all'" in (answer["status"]["message"])
        )
        dev = gpu_pod(1, limits=True)
        dev["spec"]["volumes"] = [{"name": "gpus", "hostPath": {"path": "/dev/nvidia0"}}]
        answer = await hook.post("mutate", dev)
        assert not answer["allowed"]
        assert (
            "volume \"gpus\" mounts spec.volumes[0].hostPath.path='/dev/nvidia0'"
            in answer["status"]["message"]
        )


async def test_kubectl_debug_adding_a_container_that_names_gpus_is_denied(tmp_path):
    async with webhook(tmp_path) as hook:
        _, stored = await hook.admit(gpu_pod(1, limits=True))
        debugged = apply_patch(
            stored,
            [
                {
                    "op": "add",
                    "path": "/spec/ephemeralContainers",
                    "value": [
                        {"name": "debugger-x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
                    ],
                }
            ],
        )
        answer = await hook.post(
            "validate", debugged, operation="UPDATE", old=stored, sub_resource="ephemeralcontainers"
        )
        assert not answer["allowed"] and answer["status"]["code"] == 403
        assert (
            "container \"debugger-x\" sets spec.ephemeralContainers[0].env[NVIDIA_VISIBLE_DEVICES]='all'"
            in answer["status"]["message"]
        )
        harmless = apply_patch(
            stored, [{"op": "add", "path": "/spec/ephemeralContainers", "value": [{"name": "d"}]}]
        )
        answer = await hook.post(
            "validate", harmless, operation="UPDATE", old=stored, sub_resource="ephemeralcontainers"
        )
        assert answer["allowed"]
        # other subresources never reach the checks (status writes carry the whole pod too)
        answer = await hook.post("validate", debugged, operation="UPDATE", old=stored, sub_resource="status")
        assert answer["allowed"]


async def test_another_schedulers_pod_is_not_placed_but_still_may_not_name_gpus(tmp_path):
    async with webhook(tmp_path) as hook:
        pod = with_env(gpu_pod(None), NVIDIA_VISIBLE_DEVICES="all")
        pod["spec"]["schedulerName"] = "volcano"
        answer = await hook.post("mutate", pod)
        assert not answer["allowed"] and "env[NVIDIA_VISIBLE_DEVICES]='all'" in answer["status"]["message"]
        pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
        assert (await hook.post("mutate", pod))["allowed"]
