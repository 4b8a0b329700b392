"""Builders shared by the webhook, actor and explain tests and the webhook benchmark."""

from __future__ import annotations

import itertools
import uuid

from devcluster.nodes import make_node
from gpuledger.service.ledger_service import LedgerService
from gpuledger.webhook.admission.handler import AdmissionHandler
from gpuledger.webhook.admission.review import make_review, parse_review
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.ledger.client import InProcessLedgerClient

HMAC_KEY = "test-placement-key"
_names = itertools.count()


def cluster(
    nodes: int = 4, gpus: int = 8, leaves: int = 2, spines: int = 1, tainted: bool = False
) -> list[dict]:
    """`nodes` GPU nodes spread over leaves and spines, each with a device annotation (UUIDs)."""
    out = []
    for i in range(nodes):
        leaf = i % leaves
        out.append(
            make_node(
                f"node-{i:04d}",
                spine=f"spine-{leaf % spines}",
                leaf=f"leaf-{leaf}",
                gpus=gpus,
                agentaflow=True,
                tainted=tainted,
                cpu=128,
                memory_gi=1024,
            )
        )
    return out


def gpu_pod(
    gpus: int | None = 1,
    name: str | None = None,
    annotations: dict | None = None,
    limits: bool = False,
    namespace: str = "default",
    containers: int = 1,
    **meta,
) -> dict:
    """A pod asking for `gpus` GPUs by annotation (or by container limits with limits=True)."""
    ann = dict(annotations or {})
    if gpus is not None and not limits:
        ann.setdefault("topology.scheduler/gpu-count", str(gpus))
    resources = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if limits and gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"pod-{next(_names)}",
            "namespace": namespace,
            "annotations": ann,
            **meta,
        },
        "spec": {
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": resources if i == 0 else {},
                    "futureField": {"kept": True},
                }
                for i in range(containers)
            ],
            "someUnknownField": "survives",
        },
    }
    return pod


def config(**overrides) -> WebhookConfig:
    # when_full: these tests' pods that do not fit are refused, as before waiting existed; the tests of
    # waiting pods (tests/webhook/test_waiting_admission.py) ask for the default, wait
    values = {"hmac_key": HMAC_KEY, "deadline_s": 2.0, "when_full": "refuse"}
    values.update(overrides)
    return WebhookConfig(**values)


def service(objects: list[dict], cfg: WebhookConfig | None = None, now: float = 1000.0) -> LedgerService:
    cfg = cfg or config()
    return LedgerService(cfg.ledger_config(), {"kind": "objects", "objects": objects}, now=now)


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def handler(
    objects: list[dict],
    cfg: WebhookConfig | None = None,
    owners=None,
    clock: Clock | None = None,
) -> tuple[AdmissionHandler, LedgerService]:
    cfg = cfg or config()
    svc = service(objects, cfg)
    client = InProcessLedgerClient(svc, clock or Clock())
    return AdmissionHandler(cfg, client, owners), svc


def review(pod: dict, **kwargs):
    kwargs.setdefault("uid", str(uuid.uuid4()))
    return parse_review(make_review(pod, **kwargs))


def apply_patch(pod: dict, ops: list[dict]) -> dict:
    import jsonpatch

    return jsonpatch.apply_patch(pod, ops)
