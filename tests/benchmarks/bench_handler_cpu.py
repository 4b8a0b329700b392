"""CPU per admission inside the webhook process, without HTTP/TLS: body bytes -> AdmissionReview answer bytes.

    .venv/bin/python tests/benchmarks/bench_handler_cpu.py              # ~20 s
    .venv/bin/python tests/benchmarks/bench_handler_cpu.py --profile    # and a cProfile of the mutate path
    .venv/bin/python tests/benchmarks/bench_handler_cpu.py --steps      # and each mutate step alone, hot

The part of an admission that is the webhook's own code: decode the body, `parse_review`, the handler
(`mutate`: request, the ledger call, patch, signature; `validate`: signature, binding, the ledger claim),
`encode_response`, encode the answer; against a no-op doing the same decode and a minimal answer. The ledger
is in-process (`InProcessLedgerClient`, 1,000 nodes x 8 GPUs, emptied between repetitions), so its
~30 us per decision is included; Ray and the network are not. Timed with `time.process_time` (CPU of this
process), so other load on a shared machine moves it less than wall-clock rates. The bodies are the same
3.5 KB pods as bench_webhook.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_webhook import _pod_body  # noqa: E402


async def _drive(handler, bodies: list[bytes], route: str, loads, dumps, parse, encode) -> list[bytes]:
    out = []
    for body in bodies:
        review = parse(loads(body))
        decision = await (handler.mutate(review) if route == "mutate" else handler.validate(review))
        out.append(dumps(encode(review.uid, decision, review.api_version)))
    return out


def _validate_bodies(mutate_bodies: list[bytes], answers: list[bytes]) -> list[bytes]:
    """The mutated pods, as the API server would send them to the validating webhook."""
    import jsonpatch

    out = []
    for body, answer in zip(mutate_bodies, answers, strict=True):
        review = json.loads(body)
        patch = json.loads(base64.b64decode(json.loads(answer)["response"]["patch"]))
        review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], patch)
        review["request"]["object"]["metadata"]["uid"] = "u-" + review["request"]["uid"]
        out.append(json.dumps(review, separators=(",", ":")).encode())
    return out


def mutate_steps(handler, loads, dumps, parse, encode, n: int = 20000) -> dict[str, float]:
    """CPU of each step of a placed pod's mutation, alone and hot (one pod, `n` times each): what an
    admission's own work is made of, for docs/benchmarks.md's budget. The handler's real functions; the
    ledger's placement is taken from one real admission."""
    import io
    import logging
    from types import SimpleNamespace

    from gpuledger.core.model import Placement
    from gpuledger.core.pods.placement_codec import binding_of, encode_placement
    from gpuledger.webhook.admission import env_guard
    from gpuledger.webhook.admission.patch import apply_placement, patch_of, shallow_pod, strip_ledger_keys
    from gpuledger.webhook.logs import admission_fields, configure, log_admission

    body = _pod_body(0, "steps")
    review = parse(loads(body))
    decision = asyncio.run(handler.mutate(review))
    pod, namespace, key, config = review.object, review.namespace, handler.key, handler.config
    placement = Placement(  # the one the handler wrote, as the ledger answered it
        id=decision.reservation_id, node=decision.node, devices=tuple(decision.devices), strategy="bench"
    )
    binding = binding_of(pod, namespace, review.name)
    annotation = encode_placement(placement, key, binding)

    def applied() -> dict:
        work = shallow_pod(pod)
        strip_ledger_keys(work)
        apply_placement(
            work,
            placement,
            annotation,
            binding_mode=config.binding_mode,
            visibility_mode=config.visibility_mode,
            affinity_key=config.affinity_key,
            gpu_resource=config.gpu_resource,
        )
        return work

    work = applied()
    ops = patch_of(pod, work)
    stream = io.StringIO()
    configure("json", "INFO", stream)
    logger = logging.getLogger("gpuledger.admission")
    metrics = handler.metrics
    answer = SimpleNamespace(**{**vars(decision), "ledger_batch": 1})

    def log_line() -> None:
        log_admission(logger, admission_fields("mutate", review, answer, 0.0005))

    duration = metrics.admission_duration.labels("mutate", "placed")  # the route keeps its child too

    def counted() -> None:  # what one placed admission counts, route and handler
        metrics.in_flight.inc()
        metrics.shaped("hit")
        metrics.decided("bench", "placed")
        metrics.observe_decision("bench", 0.0005)
        metrics.in_flight.dec()
        duration.observe(0.0005)

    steps = {
        "body decode (orjson)": lambda: loads(body),
        "body decode + parse_review": lambda: parse(loads(body)),
        "shape key": lambda: handler.shapes.key(pod, namespace),
        "binding_of": lambda: binding_of(pod, namespace, review.name),
        "encode_placement (canonical JSON + HMAC)": lambda: encode_placement(placement, key, binding),
        "shallow_pod + strip + apply_placement": applied,
        "patch_of": lambda: patch_of(pod, work),
        "env_guard.replacements": lambda: env_guard.replacements(pod, work, config.visibility_mode),
        "answer: encode_response + dumps (patch JSON, base64)": lambda: dumps(
            encode(review.uid, decision, review.api_version)
        ),
        "the log line (fields + log_admission)": log_line,
        "metrics (6 updates, as one admission)": counted,
    }

    async def timed() -> dict[str, float]:  # in a loop, as served: the log lines are written once a turn
        out = {}
        for name, step in steps.items():
            t = time.process_time()
            for i in range(n):
                step()
                if i % 64 == 0:
                    await asyncio.sleep(0)
            out[name] = (time.process_time() - t) / n * 1e6
            stream.seek(0)
            stream.truncate()
        return out

    figures = asyncio.run(timed())
    logging.getLogger().handlers.clear()
    print(f"the mutating path's steps, one pod, hot, {n} times each (us; {len(ops)} patch ops):")
    for name, us in figures.items():
        print(f"  {name:<54}{us:7.2f}")
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--admissions", type=int, default=3000, help="per repetition and route")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--sort", default="cumulative", help="cProfile order: cumulative | tottime")
    p.add_argument("--callers", help="also print who calls functions matching this (cProfile)")
    p.add_argument("--json", help="write the figures here too")
    p.add_argument(
        "--steps", action="store_true", help="also time the mutating path's steps one by one, on one pod"
    )
    args = p.parse_args(argv)

    from gpuledger.service.ledger_service import LedgerService
    from gpuledger.webhook.admission.handler import AdmissionHandler
    from gpuledger.webhook.admission.review import encode_response, parse_review
    from gpuledger.webhook.config import WebhookConfig
    from gpuledger.webhook.ledger.client import InProcessLedgerClient
    from tests.webhook.webhook_support import cluster

    try:  # the app's codec, whichever this tree has (orjson; the standard library in a tree without it)
        from gpuledger.webhook.admission.review import dumps, loads
    except ImportError:
        loads = json.loads

        def dumps(o) -> bytes:
            return json.dumps(o, separators=(",", ":")).encode()

    config = WebhookConfig(hmac_key="bench-key", deadline_s=2.0)
    service = LedgerService(
        config.ledger_config(),
        {"kind": "objects", "objects": cluster(args.nodes, 8, leaves=31, spines=3)},
        0.0,
    )
    handler = AdmissionHandler(config, InProcessLedgerClient(service, time.time))
    n = args.admissions

    def noop(
        body: bytes,
    ) -> bytes:  # the no-op aiohttp handler of bench_webhook.py: the standard library's json
        review = json.loads(body)
        return json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            },
            separators=(",", ":"),
        ).encode()

    results: dict[str, list[float]] = {"noop": [], "mutate": [], "validate": []}
    for r in range(args.repeat):
        bodies = [_pod_body(i, f"r{r}") for i in range(n)]
        t = time.process_time()
        for b in bodies:
            noop(b)
        results["noop"].append((time.process_time() - t) / n * 1e6)
        t = time.process_time()
        answers = asyncio.run(_drive(handler, bodies, "mutate", loads, dumps, parse_review, encode_response))
        results["mutate"].append((time.process_time() - t) / n * 1e6)
        assert all(b'"allowed":true' in a for a in answers), answers[0][:300]
        vbodies = _validate_bodies(bodies, answers)
        t = time.process_time()
        vanswers = asyncio.run(
            _drive(handler, vbodies, "validate", loads, dumps, parse_review, encode_response)
        )
        results["validate"].append((time.process_time() - t) / n * 1e6)
        assert all(b'"allowed":true' in a for a in vanswers), vanswers[0][:300]
        service.sweep(time.time() + 1e6)  # nothing is stored: every reservation expires, the ledger empties

    print(f"CPU per admission (us), {args.repeat} x {n}, median [min-max]:")
    figures = {}
    for k, v in results.items():
        figures[k] = {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
        print(f"  {k:<9} {statistics.median(v):8.1f}  [{min(v):.1f}-{max(v):.1f}]")
    print(
        f"  mutate - noop {figures['mutate']['median_us'] - figures['noop']['median_us']:.1f} us, "
        f"validate - noop {figures['validate']['median_us'] - figures['noop']['median_us']:.1f} us"
    )
    if args.profile:
        bodies = [_pod_body(i, "prof") for i in range(n)]
        prof = cProfile.Profile()
        prof.enable()
        answers = asyncio.run(_drive(handler, bodies, "mutate", loads, dumps, parse_review, encode_response))
        prof.disable()
        vbodies = _validate_bodies(bodies, answers)
        prof.enable()
        asyncio.run(_drive(handler, vbodies, "validate", loads, dumps, parse_review, encode_response))
        prof.disable()
        stats = pstats.Stats(prof).sort_stats(args.sort)
        stats.print_stats(45)
        if args.callers:
            stats.print_callers(args.callers)
    if args.steps:
        figures["steps_us"] = mutate_steps(handler, loads, dumps, parse_review, encode_response)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
