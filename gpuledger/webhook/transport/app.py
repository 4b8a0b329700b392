"""The HTTP surface: POST /mutate, POST /validate, GET /healthz, /readyz, /metrics.

Transport problems (no body, wrong content type, bad JSON, too big) are answered 400/413 before anything
else runs; everything past that point answers an AdmissionReview that echoes the request's uid, and writes one
log line. Events are posted by a background task the app starts and stops, never on a request's time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

from gpuledger.webhook.admission.handler import AdmissionHandler
from gpuledger.webhook.admission.owners import OwnerLookup
from gpuledger.webhook.admission.review import (
    Decision,
    ReviewError,
    dumps,
    encode_response,
    loads,
    parse_review,
)
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.kube.events import EventPoster, EventSettings, EventWriter
from gpuledger.webhook.ledger.client import LedgerClient
from gpuledger.webhook.logs import ADMISSION_LOGGER, admission_fields, log_admission
from gpuledger.webhook.metrics import WebhookMetrics

log = logging.getLogger("gpuledger.webhook")
admission_log = logging.getLogger(ADMISSION_LOGGER)

HANDLER_KEY = web.AppKey("handler", AdmissionHandler)
METRICS_KEY = web.AppKey("metrics", WebhookMetrics)
LEDGER_KEY = web.AppKey[LedgerClient]("ledger")  # a Protocol: given as the type argument
CONFIG_KEY = web.AppKey("config", WebhookConfig)
EVENTS_KEY = web.AppKey[EventPoster | None]("events")  # None when the app posts no Events
_READY_KEY = web.AppKey("ready_cache", dict)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _plain(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status, dumps=_dumps)


def _answer(review: dict) -> web.Response:
    """An AdmissionReview answer: JSON bytes straight into the body (no str round trip)."""
    return web.Response(body=dumps(review), content_type="application/json")


async def _read_review(request: web.Request, limit: int) -> Any:
    """The decoded JSON body, or a 400/413 Response."""
    if request.content_length is not None and request.content_length > limit:
        return _plain(413, f"body of {request.content_length} bytes is over the {limit}-byte limit")
    if request.content_type != "application/json":
        return _plain(
            400, f"content type {request.content_type!r} is not accepted: expected application/json"
        )
    # StreamReader.read(n) returns what has arrived so far, not n bytes: read until EOF (a body split across
    # TLS records must not be parsed half-read), stopping as soon as the cap is passed
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := await request.content.read(64 * 1024):
            size += len(chunk)
            if size > limit:
                return _plain(413, f"body is over the {limit}-byte limit")
            chunks.append(chunk)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        return _plain(400, f"body could not be read: {exc}")
    body = b"".join(chunks)
    if not body:
        return _plain(400, "empty body: expected an AdmissionReview")
    try:
        return loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return _plain(400, f"body is not JSON: {exc}")


def _route(kind: str):
    durations: dict[str, Any] = {}  # outcome -> this route's histogram child (one app, one metrics registry)

    async def handle(request: web.Request) -> web.Response:
        app = request.app
        metrics, handler, config = app[METRICS_KEY], app[HANDLER_KEY], app[CONFIG_KEY]
        started = time.perf_counter()
        metrics.in_flight.inc()
        outcome = "transport"
        try:
            data = await _read_review(request, config.max_body_bytes)
            if isinstance(data, web.Response):
                return data
            try:
                review = parse_review(data)
            except ReviewError as exc:
                outcome = "invalid"
                if not exc.uid:
                    return _plain(400, str(exc))
                decision = Decision(False, code=400, reason="BadRequest", message=f"gpuledger: {exc}")
                return _answer(encode_response(exc.uid, decision, exc.api_version))
            try:
                decision = await (handler.mutate(review) if kind == "mutate" else handler.validate(review))
            except Exception as exc:  # the handlers catch their own; this is the last line
                log.exception("%s %s failed", kind, review.uid)
                metrics.handler_failures.labels(kind).inc()
                decision = Decision(
                    False,
                    code=500,
                    reason="InternalError",
                    outcome="error",
                    message=f"gpuledger webhook internal error ({type(exc).__name__}: {exc})",
                )
            outcome = decision.outcome or ("allowed" if decision.allowed else "denied")
            if admission_log.isEnabledFor(logging.INFO):  # the fields are only worth building for a line
                latency = time.perf_counter() - started
                log_admission(admission_log, admission_fields(kind, review, decision, latency))
            return _answer(encode_response(review.uid, decision, review.api_version))
        finally:
            metrics.in_flight.dec()
            child = durations.get(outcome)
            if child is None:  # prometheus' labels() costs more than the observation: one lookup per outcome
                child = durations[outcome] = metrics.admission_duration.labels(kind, outcome)
            child.observe(time.perf_counter() - started)

    return handle


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    """Ready once the ledger answers and has synced its inventory (cached briefly: probes are frequent)."""
    app = request.app
    cache = app[_READY_KEY]
    now = time.monotonic()
    if cache.get("until", 0) <= now:
        config = app[CONFIG_KEY]
        try:
            status = await asyncio.wait_for(app[LEDGER_KEY].status(), timeout=config.deadline_s)
            ok = bool(status.get("ready")) and bool(status.get("synced"))
            text = "ready" if ok else f"ledger not synced yet ({status.get('source')})"
        except Exception as exc:  # noqa: BLE001 - any failure is "not ready"
            ok, text = False, f"ledger unavailable: {type(exc).__name__}: {exc}"
        cache.update(until=now + config.ready_cache_s, ok=ok, text=text)
    return web.Response(status=200 if cache["ok"] else 503, text=cache["text"] + "\n")


async def _metrics(request: web.Request) -> web.Response:
    app = request.app
    metrics = app[METRICS_KEY]
    try:
        stats = await asyncio.wait_for(app[LEDGER_KEY].stats(), timeout=app[CONFIG_KEY].deadline_s)
        metrics.update_from_stats(stats)
    except Exception as exc:  # noqa: BLE001 - serve the last values rather than nothing
        log.warning("ledger stats unavailable for /metrics: %s", exc)
    return web.Response(body=metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4"})


def create_app(
    config: WebhookConfig,
    ledger_client: LedgerClient,
    owner_lookup: OwnerLookup | None = None,
    *,
    metrics: WebhookMetrics | None = None,
    key: bytes | None = None,
    event_writer: EventWriter | None = None,
    event_settings: EventSettings | None = None,
) -> web.Application:
    """The webhook as an aiohttp Application (serve it with gpuledger.webhook.transport.server.start_server,
    or any
    runner). With an `event_writer` (gpuledger.webhook.kube.event_writer.ApiEventWriter), decisions are
    posted as Kubernetes
    Events."""
    metrics = metrics or WebhookMetrics()
    # the client's own tally, where it keeps one (read from its __dict__: a test double may refuse getattr)
    transport_calls = getattr(ledger_client, "__dict__", {}).get("transport_calls")
    if isinstance(transport_calls, dict):
        metrics.count_ledger_calls(transport_calls)
    poster = EventPoster(event_writer, event_settings, registry=metrics.registry) if event_writer else None
    handler = AdmissionHandler(config, ledger_client, owner_lookup, metrics, key=key, event_sink=poster)
    # the body cap is enforced in _read_review (400/413 before any parsing); aiohttp's own cap is a backstop
    app = web.Application(client_max_size=config.max_body_bytes + 1024)
    app[HANDLER_KEY] = handler
    app[METRICS_KEY] = metrics
    app[LEDGER_KEY] = ledger_client
    app[CONFIG_KEY] = config
    app[_READY_KEY] = {}
    app[EVENTS_KEY] = poster
    if poster is not None:

        async def start_events(app: web.Application) -> None:
            poster.start()

        async def stop_events(app: web.Application) -> None:
            await poster.stop()

        app.on_startup.append(start_events)
        app.on_cleanup.append(stop_events)
    if handler.prefetch is not None:
        prefetch = handler.prefetch

        async def start_prefetch(app: web.Application) -> None:
            prefetch.start()

        async def stop_prefetch(app: web.Application) -> None:
            await prefetch.stop()  # what it still holds goes back to the ledger

        app.on_startup.append(start_prefetch)
        app.on_cleanup.append(stop_prefetch)
    close_owners = getattr(owner_lookup, "close", None)
    if close_owners is not None:  # an owner lookup with connections of its own (KubeOwners)

        async def stop_owners(app: web.Application) -> None:
            await close_owners()

        app.on_cleanup.append(stop_owners)
    app.router.add_post("/mutate", _route("mutate"))
    app.router.add_post("/validate", _route("validate"))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app
