"""KubeObjectReader's answers that are not a workload, from a raw HTTP server: each an OwnerLookupError that
names the object and what came back (the admission then answers as for the ledger being unavailable), never a
crash; a 404 is an owner that is gone (None). The API server's own answers: tests/e2e/test_event_writer.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from kubernetes import client

from gpuledger.webhook.admission.owners import KubeObjectReader, OwnerLookupError

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def answering(status: int, body: bytes):
    paths: list[bytes] = []

    async def answer(reader, writer):
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                paths.append(head.split(b" ")[1])
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
                await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader = KubeObjectReader(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")))
    try:
        yield reader, paths
    finally:
        await reader.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (200, b"<html>proxy login</html>", r"reading Job ml/train: the answer is not JSON"),
        (200, b"[1, 2]", r"reading Job ml/train: the answer is not a JSON object"),
        (
            500,
            b'{"kind":"Status","message":"etcdserver: request timed out"}',
            r"HTTP 500: etcdserver: request",
        ),
        (503, b"upstream connect error", r"reading Job ml/train: HTTP 503$"),
    ],
)
async def test_an_answer_that_is_not_a_workload_is_a_lookup_error(status, body, said):
    async with answering(status, body) as (reader, paths):
        with pytest.raises(OwnerLookupError, match=said):
            await reader("Job", "ml", "train")
        assert paths == [b"/apis/batch/v1/namespaces/ml/jobs/train"]


async def test_a_gone_owner_is_none_and_kinds_map_to_their_api_paths():
    async with answering(404, b'{"kind":"Status","reason":"NotFound"}') as (reader, paths):
        assert await reader("Deployment", "ml", "web") is None
        assert await reader("PyTorchJob", "ml", "a b") is None
        assert paths == [
            b"/apis/apps/v1/namespaces/ml/deployments/web",
            b"/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/a%20b",
        ]
        assert reader.api.opened == 1


async def test_an_unreachable_api_server_is_a_lookup_error():
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        reader = KubeObjectReader(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")))
        with pytest.raises(OwnerLookupError, match=r"reading Job ml/train: ApiHttpError\('could not connect"):
            await reader("Job", "ml", "train")
        await reader.close()
