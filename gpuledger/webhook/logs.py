"""Log output: JSON lines for log collectors (python-json-logger), `key=value` text for a terminal, and the
one line written per admission.

Formats only: it decides nothing and never holds an admission up beyond writing its line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import IO, Any

from pythonjsonlogger.core import RESERVED_ATTRS, LogData
from pythonjsonlogger.json import JsonFormatter
from pythonjsonlogger.orjson import OrjsonFormatter

LOG_FORMATS = ("json", "text")
LOG_FORMAT_ENV = "GPULEDGER_LOG_FORMAT"
ADMISSION_LOGGER = "gpuledger.admission"

# the admission line's fields, in the order the text format prints them
ADMISSION_FIELDS = (
    "route",
    "uid",
    "namespace",
    "pod",
    "decision",
    "allowed",
    "code",
    "node",
    "devices",
    "strategy",
    "reservation_id",
    "latency_ms",
    "ledger_batch",
)


def choose_format(
    flag: str | None = None, environ: Mapping[str, str] = os.environ, stream: IO | None = None
) -> str:
    """The flag, else $GPULEDGER_LOG_FORMAT, else text on a terminal and json anywhere else."""
    value = flag or environ.get(LOG_FORMAT_ENV) or ""
    if value:
        if value not in LOG_FORMATS:
            raise ValueError(f"log format {value!r} is not accepted: expected {' or '.join(LOG_FORMATS)}")
        return value
    stream = stream if stream is not None else sys.stderr
    return "text" if getattr(stream, "isatty", lambda: False)() else "json"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v
        for k, v in record.__dict__.items()
        if k not in RESERVED_ATTRS and k != "taskName" and not k.startswith("_")
    }


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`: the same fields as the JSON line, for a human."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if not extras:
            return line
        ordered = [k for k in ADMISSION_FIELDS if k in extras] + sorted(
            k for k in extras if k not in ADMISSION_FIELDS
        )
        pairs = " ".join(f"{k}={_text(extras[k])}" for k in ordered)
        head, newline, rest = line.partition("\n")  # keep a traceback below the line
        return f"{head} {pairs}{newline}{rest}"


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


class _OrjsonLines(OrjsonFormatter):
    """python-json-logger's orjson formatter: 40% less CPU per line than its stdlib `json` one (an admission
    line measured 42 -> 26 us here), which matters at one line per admission. orjson refuses what the
    stdlib encodes (integers past 64 bits): such a record is encoded by the stdlib formatter instead of
    being lost."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._stdlib = JsonFormatter(**kwargs)

    def jsonify_log_record(self, log_data: LogData) -> str:
        try:
            return super().jsonify_log_record(log_data)
        except TypeError:  # orjson.JSONEncodeError
            return self._stdlib.jsonify_log_record(log_data)


def json_formatter() -> logging.Formatter:
    return _OrjsonLines(
        fmt="{levelname}{name}{message}",
        style="{",
        timestamp="time",
        rename_fields={"levelname": "level", "name": "logger"},
    )


def configure(log_format: str, level: str | int = "INFO", stream: IO | None = None) -> logging.Handler:
    """One handler on the root logger (replacing any), so every library's records come out the same way."""
    global _direct
    out = stream if stream is not None else sys.stderr
    lines = _LineBatches(out) if log_format == "json" else None
    handler = lines or logging.StreamHandler(out)
    handler.setFormatter(json_formatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    _direct = lines
    return handler


class _LineBatches(logging.StreamHandler):
    """The JSON handler: a StreamHandler whose admission lines (`log_admission`) are written together, once
    per turn of the event loop that logged them: one write and flush for all the lines of a turn, where each
    line had its own (a system call per admission, ~5% of the webhook's CPU at 100 in flight). A line
    waits at most for the end of the loop's current turn; any other record, a flush and `logging.shutdown`
    write the waiting lines first, so the output keeps the order the lines were logged in."""

    def __init__(self, stream: IO) -> None:
        super().__init__(stream)
        self._waiting: list[str] = []
        self._drain_on: asyncio.AbstractEventLoop | None = None  # the loop a drain is scheduled on

    def add_line(self, text: str) -> None:
        """Queue an encoded line for the running loop's next turn (written at once when no loop runs here)."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        self.acquire()
        try:
            self._waiting.append(text)
            if running is not None and self._drain_on is running:  # this turn's drain is already asked for
                return
            if running is not None:
                self._drain_on = running
        finally:
            self.release()
        if running is None:  # logged outside a loop: nothing would come back to write it
            self.drain()
        else:
            running.call_soon(self.drain)

    def drain(self) -> None:
        self.acquire()
        try:
            self._drain_on = None
            if not self._waiting:
                return
            text, self._waiting = "".join(self._waiting), []
            try:
                self.stream.write(text)
                super().flush()
            except Exception:  # noqa: BLE001 - as a handler would: report it on stderr, never fail the loop
                self.handleError(logging.makeLogRecord({"msg": "admission lines", "levelno": logging.INFO}))
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        self.drain()
        super().emit(record)

    def flush(self) -> None:
        self.drain()
        super().flush()


# the JSON handler `configure` installed: admission lines go straight to it while it is the only way out
_direct: _LineBatches | None = None


def pod_of(obj: dict | None, name: str = "") -> str:
    """The pod's name as the admission knows it; a generateName pod has none yet (`web-7d9f-*`)."""
    meta = (obj or {}).get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    if name or meta.get("name"):
        return str(name or meta.get("name"))
    return f"{meta['generateName']}*" if meta.get("generateName") else ""


def admission_fields(route: str, review: Any, decision: Any, latency_s: float) -> dict[str, Any]:
    """The admission line: who, what was decided, where, by which strategy, how long, in which batch."""
    return {
        "route": route,
        "uid": review.uid,
        "namespace": review.namespace,
        "pod": pod_of(review.object or review.old_object, review.name),
        "decision": decision.outcome or ("allowed" if decision.allowed else "denied"),
        "allowed": decision.allowed,
        "code": decision.code if not decision.allowed else 200,
        "node": decision.node,
        "devices": list(decision.devices),
        "strategy": decision.strategy or None,
        "reservation_id": decision.reservation_id,
        "latency_ms": round(latency_s * 1000.0, 3),
        "ledger_batch": decision.ledger_batch or None,
    }


def log_admission(logger: logging.Logger, fields: dict[str, Any]) -> None:
    """One line per admission. While the JSON handler of `configure` is the only place the line can go (the
    shipped set-up), the line is encoded here, the same line the formatter writes, and the handler writes the
    lines of one event-loop turn together (`_LineBatches`): a record
    through `logging` and python-json-logger runs ~30 functions, and on a pod's path, with the API server and
    etcd on the same cores, that cold code cost as much CPU as the mutating handler itself (bench_pod_create,
    docs/benchmarks.md). Anything else (other handlers, filters, the text format) gets the ordinary record."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _direct
    if handler is None or not _only_way_out(logger, handler):
        logger.info("admission", extra=fields)
        return
    line = {"level": "INFO", "logger": logger.name, "message": "admission", **fields}
    line["time"] = datetime.now(UTC).isoformat()
    formatter: _OrjsonLines = handler.formatter  # type: ignore[assignment]  # (checked by _only_way_out)
    handler.add_line(formatter.jsonify_log_record(line) + handler.terminator)  # its encoder and fallback


def _only_way_out(logger: logging.Logger, handler: _LineBatches) -> bool:
    """The record would reach `handler` alone, unfiltered, with `configure`'s formatter: `logger` and its
    ancestors up to the root have no handlers or filters of their own and propagate."""
    node: Any = logger
    while node.parent is not None:
        if node.handlers or node.filters or not node.propagate or node.disabled:
            return False
        node = node.parent
    return (
        node.handlers == [handler]
        and not node.filters
        and not handler.filters
        and isinstance(handler.formatter, _OrjsonLines)
        and handler.level <= logging.INFO
    )
