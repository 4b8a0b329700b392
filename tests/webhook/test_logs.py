"""One log line per admission, JSON for collectors and key=value text for a terminal; the ledger batch it
rode in."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging

import pytest

from gpuledger.webhook import logs
from gpuledger.webhook.admission.review import make_review
from gpuledger.webhook.ledger import batcher
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.serve import build_parser
from gpuledger.webhook.transport.app import create_app
from tests.webhook.webhook_support import Clock, cluster, config, gpu_pod, service


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_choose_format_flag_then_env_then_terminal():
    assert logs.choose_format("text", {"GPULEDGER_LOG_FORMAT": "json"}, Tty()) == "text"
    assert logs.choose_format(None, {"GPULEDGER_LOG_FORMAT": "json"}, Tty()) == "json"
    assert logs.choose_format(None, {}, Tty()) == "text"
    assert logs.choose_format(None, {}, io.StringIO()) == "json"  # a pipe, a container's log
    with pytest.raises(ValueError, match="log format 'yaml' is not accepted: expected json or text"):
        logs.choose_format(None, {"GPULEDGER_LOG_FORMAT": "yaml"}, Tty())


def test_serve_takes_log_format():
    base = ["--tls-cert", "c", "--tls-key", "k"]
    assert build_parser().parse_args([*base, "--log-format", "json"]).log_format == "json"
    assert build_parser().parse_args(base).log_format is None
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--log-format", "xml"])


@pytest.fixture
def captured():
    """The admission logger's records, formatted both ways."""
    stream_json, stream_text = io.StringIO(), io.StringIO()
    logger = logging.getLogger(logs.ADMISSION_LOGGER)
    handlers = [logging.StreamHandler(stream_json), logging.StreamHandler(stream_text)]
    handlers[0].setFormatter(logs.json_formatter())
    handlers[1].setFormatter(logs.TextFormatter())
    level = logger.level
    logger.setLevel(logging.INFO)
    for h in handlers:
        logger.addHandler(h)
    yield stream_json, stream_text
    for h in handlers:
        logger.removeHandler(h)
    logger.setLevel(level)


async def test_one_json_line_per_admission_with_every_field(aiohttp_client, captured):
    stream_json, stream_text = captured
    client = await aiohttp_client(
        create_app(config(), InProcessLedgerClient(service(cluster(2, 8)), Clock()))
    )
    await client.post(
        "/mutate",
        json=make_review(
            gpu_pod(
                2,
                name="train",
                namespace="ml",
                annotations={"agentaflow.gpu/scheduling-strategy": "best-fit"},
            ),
            uid="u-1",
        ),
    )
    await client.post("/mutate", json=make_review(gpu_pod(99, name="huge", namespace="ml"), uid="u-2"))
    await client.post("/validate", json=make_review(gpu_pod(1, name="v", namespace="ml"), uid="u-3"))
    lines = [json.loads(line) for line in stream_json.getvalue().splitlines()]
    assert [line["uid"] for line in lines] == ["u-1", "u-2", "u-3"]
    placed, denied, validated = lines
    assert (
        placed["message"] == "admission"
        and placed["level"] == "INFO"
        and placed["logger"] == "gpuledger.admission"
    )
    assert "time" in placed
    assert {
        k: placed[k]
        for k in ("route", "namespace", "pod", "decision", "allowed", "code", "strategy", "ledger_batch")
    } == {
        "route": "mutate",
        "namespace": "ml",
        "pod": "train",
        "decision": "placed",
        "allowed": True,
        "code": 200,
        "strategy": "best_fit",
        "ledger_batch": 1,
    }
    assert placed["node"].startswith("node-") and len(placed["devices"]) == 2 and placed["reservation_id"]
    assert isinstance(placed["latency_ms"], float) and placed["latency_ms"] >= 0
    assert (denied["decision"], denied["allowed"], denied["code"], denied["node"], denied["devices"]) == (
        "denied",
        False,
        403,
        None,
        [],
    )
    assert validated["route"] == "validate" and validated["ledger_batch"] is None
    text = stream_text.getvalue().splitlines()
    assert (
        "gpuledger.admission: admission route=mutate uid=u-1 namespace=ml pod=train decision=placed"
        in text[0]
    )
    assert "devices=" in text[0] and "strategy=best_fit" in text[0] and "ledger_batch=1" in text[0]
    assert "node=- devices=- strategy=default" in text[1]


async def test_generate_name_pods_log_their_prefix(aiohttp_client, captured):
    stream_json, _ = captured
    client = await aiohttp_client(
        create_app(config(), InProcessLedgerClient(service(cluster(1, 8)), Clock()))
    )
    pod = gpu_pod(1, namespace="ml")
    pod["metadata"].pop("name")
    pod["metadata"]["generateName"] = "web-7d9f-"
    await client.post("/mutate", json=make_review(pod, uid="u"))
    assert json.loads(stream_json.getvalue())["pod"] == "web-7d9f-*"


def test_configure_sets_one_root_handler_in_the_chosen_format():
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        stream = io.StringIO()
        logs.configure("json", "debug", stream)
        logs.configure("json", "info", stream)  # again: still one handler
        assert len(root.handlers) == 1 and root.level == logging.INFO
        logging.getLogger("gpuledger.serve").info("listening", extra={"port": 8443})
        line = json.loads(stream.getvalue())
        assert line["message"] == "listening" and line["port"] == 8443 and line["logger"] == "gpuledger.serve"
        stream = io.StringIO()
        logs.configure("text", "info", stream)
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("gpuledger.x").exception("failed", extra={"uid": "u"})
        first, *trace = stream.getvalue().splitlines()
        assert first.endswith("ERROR gpuledger.x: failed uid=u") and "RuntimeError: boom" in trace[-1]
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


def test_batcher_tells_each_caller_the_size_of_its_batch():
    async def main():
        gate = asyncio.Event()

        async def send(items):
            await gate.wait()
            return [i * 10 for i in items]

        b = batcher.Batcher(send)

        async def one(i):
            result = await b.submit(i)
            return result, batcher.batch_size.get()

        first = [asyncio.create_task(one(i)) for i in range(2)]
        await asyncio.sleep(0)  # both submitted in one turn of the loop: they leave together
        await asyncio.sleep(0)
        later = [asyncio.create_task(one(i)) for i in range(2, 5)]
        await asyncio.sleep(0)  # these three wait for the call in flight, then leave together
        await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*first, *later)

    assert asyncio.run(main()) == [(0, 2), (10, 2), (20, 3), (30, 3), (40, 3)]


def test_json_lines_keep_what_orjson_refuses():
    """orjson encodes the lines; a record it refuses (an integer past 64 bits) comes out through the stdlib
    encoder instead of being lost, and a traceback stays inside its line."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.json_formatter())
    logger = logging.getLogger("gpuledger.test-json-lines")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("quantity %s", "huge", extra={"value": 2**80, "ids": (1, 2), "by_index": {3: "c"}})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    huge, failed = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (huge["level"], huge["logger"], huge["message"]) == ("WARNING", logger.name, "quantity huge")
    assert (huge["value"], huge["ids"], huge["by_index"]) == (2**80, [1, 2], {"3": "c"})
    assert "time" in huge
    assert failed["message"] == "failed" and "ValueError: boom" in failed["exc_info"]


FIELDS = {
    "route": "mutate",
    "uid": "u-9",
    "namespace": "ml",
    "pod": "train-*",
    "decision": "placed",
    "allowed": True,
    "code": 200,
    "node": "node-1",
    "devices": [0, 3],
    "strategy": "best_fit",
    "reservation_id": "r-9",
    "latency_ms": 1.25,
    "ledger_batch": None,
}


@pytest.fixture
def configured():
    """`configure`'s JSON set-up on a stream, as `gpuledger serve` ships; the root logger's handlers and level
    come back afterwards."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    stream = io.StringIO()
    handler = logs.configure("json", "INFO", stream)
    yield stream, handler
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved:
        root.addHandler(h)
    root.setLevel(level)
    logs._direct = None


def _lines(stream: io.StringIO) -> list[dict]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    stream.seek(0)
    stream.truncate()
    return lines


def test_the_admission_line_written_directly_is_the_formatters_line(configured):
    stream, handler = configured
    logger = logging.getLogger(logs.ADMISSION_LOGGER)
    logs.log_admission(logger, FIELDS)
    direct_text = stream.getvalue()
    (direct,) = _lines(stream)
    logger.info("admission", extra=FIELDS)  # the ordinary record, through python-json-logger
    (formatted,) = _lines(stream)
    assert list(direct) == list(formatted)  # the same keys in the same order
    assert {k: v for k, v in direct.items() if k != "time"} == {
        k: v for k, v in formatted.items() if k != "time"
    }
    assert direct["time"].endswith("+00:00") and len(direct["time"]) == len(formatted["time"])
    assert direct_text.endswith("}\n") and direct_text.count("\n") == 1


def test_the_admission_line_takes_the_ordinary_way_whenever_it_could_go_elsewhere(configured):
    """A filter, another handler, a handler level, the text format or a value orjson refuses: each time the
    record goes through `logging`, so whatever was set up sees it."""
    stream, handler = configured
    logger = logging.getLogger(logs.ADMISSION_LOGGER)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Filter):
        def filter(self, record):
            seen.append(record)
            return True

    keep = Keep()
    logger.addFilter(keep)
    logs.log_admission(logger, FIELDS)
    logger.removeFilter(keep)
    handler.addFilter(keep)
    logs.log_admission(logger, FIELDS)
    handler.removeFilter(keep)
    other = logging.StreamHandler(io.StringIO())
    other.addFilter(keep)
    logger.addHandler(other)
    logs.log_admission(logger, FIELDS)
    logger.removeHandler(other)
    assert len(seen) == 3 and len(_lines(stream)) == 3
    logs.log_admission(logger, {**FIELDS, "latency_ms": 2**70})  # past what orjson encodes
    (huge,) = _lines(stream)
    assert huge["latency_ms"] == 2**70
    handler.setLevel(logging.WARNING)
    logs.log_admission(logger, FIELDS)
    assert _lines(stream) == []
    handler.setLevel(logging.NOTSET)
    logs.configure("text", "INFO", stream)
    logs.log_admission(logger, FIELDS)
    assert "admission route=mutate uid=u-9" in stream.getvalue()


@contextlib.contextmanager
def _alone(handler):
    """The JSON handler as the root logger's only one (pytest adds its capture handlers for each test's call,
    after the fixtures): the set-up in which admission lines take `log_admission`'s direct way."""
    root = logging.getLogger()
    others = [h for h in root.handlers if h is not handler]
    for h in others:
        root.removeHandler(h)
    try:
        yield
    finally:
        for h in others:
            root.addHandler(h)


class _Writes(io.StringIO):
    """A stream that counts its writes."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, text):
        self.writes += 1
        return super().write(text)


def test_the_admission_lines_of_one_event_loop_turn_are_written_together_at_its_end(configured):
    _, handler = configured
    stream = _Writes()
    handler.setStream(stream)
    logger = logging.getLogger(logs.ADMISSION_LOGGER)

    async def one_turn():
        for i in range(5):
            logs.log_admission(logger, {**FIELDS, "uid": f"u-{i}"})
        assert stream.getvalue() == ""  # waiting for the end of this turn
        await asyncio.sleep(0)  # the loop turns
        assert stream.writes == 1
        assert [line["uid"] for line in _lines(stream)] == [f"u-{i}" for i in range(5)]
        logs.log_admission(logger, FIELDS)  # the next turn's lines get their own drain
        await asyncio.sleep(0)
        assert stream.writes == 2 and len(_lines(stream)) == 1

    with _alone(handler):
        asyncio.run(one_turn())


def test_a_record_logged_after_waiting_admission_lines_comes_out_after_them(configured):
    """Any other record, a flush and the end of a loop with lines still waiting: the lines are written first,
    in the order they were logged, and none is lost."""
    stream, handler = configured
    logger = logging.getLogger(logs.ADMISSION_LOGGER)

    async def logged():
        logs.log_admission(logger, {**FIELDS, "uid": "first"})
        logging.getLogger("gpuledger.webhook").warning("something else")
        logs.log_admission(logger, {**FIELDS, "uid": "third"})
        handler.flush()
        assert [line.get("uid", line["message"]) for line in _lines(stream)] == [
            "first",
            "something else",
            "third",
        ]
        logs.log_admission(logger, {**FIELDS, "uid": "last"})  # the loop ends before its next turn

    with _alone(handler):
        asyncio.run(logged())
    assert [line["uid"] for line in _lines(stream)] == ["last"]
