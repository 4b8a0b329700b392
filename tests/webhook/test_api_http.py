"""gpuledger.webhook.kube.http against real servers: an aiohttp server over TLS (keep-alive, chunked answers,
a
`Connection: close`), raw asyncio servers for what aiohttp would not do (close an idle kept-alive connection,
stop mid-answer, answer something that is not HTTP) and a CONNECT proxy in front of the TLS server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl

import pytest
from aiohttp import web

from gpuledger.certs.pki import make_ca, make_serving_cert
from gpuledger.webhook.kube.http import ApiHttp, ApiHttpError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs():
    ca = make_ca()
    return ca, make_serving_cert(ca, ["localhost"], ["127.0.0.1"])


def server_tls(certs, tmp_path) -> ssl.SSLContext:
    _, serving = certs
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(serving.cert_pem)
    key.write_bytes(serving.key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def client_tls(certs) -> ssl.SSLContext:
    ca, _ = certs
    return ssl.create_default_context(cadata=ca.cert_pem.decode())


@contextlib.asynccontextmanager
async def aiohttp_server(ctx: ssl.SSLContext):
    seen: list[dict] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        return web.json_response({"got": body.decode()}, status=201)

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b'{"items":', b"[1,2,", b"3]}"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    async def closing(request: web.Request) -> web.Response:
        return web.Response(text="bye", headers={"Connection": "close"})

    async def refused(request: web.Request) -> web.Response:
        return web.json_response({"message": "pods is forbidden"}, status=403)

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_get("/echo", echo)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/closing", closing)
    app.router.add_get("/refused", refused)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port, seen
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def raw_server(answer):
    """A plain TCP server whose connections `answer(reader, writer)` handles."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


async def test_requests_share_one_kept_alive_tls_connection(certs, tmp_path):
    async with aiohttp_server(server_tls(certs, tmp_path)) as (port, seen):
        http = ApiHttp(f"https://127.0.0.1:{port}", client_tls(certs))
        try:
            for i in range(3):
                status, body = await http.request(
                    "POST", f"/echo?n={i}", {"Content-Type": "application/json"}, b'{"i":%d}' % i
                )
                assert (status, body) == (201, b'{"got": "{\\"i\\":%d}"}' % i)
            assert await http.request("GET", "/echo", {}) == (201, b'{"got": ""}')
            assert http.opened == 1
            assert [s["path"] for s in seen] == ["/echo?n=0", "/echo?n=1", "/echo?n=2", "/echo"]
            assert seen[0]["headers"]["Host"] == f"127.0.0.1:{port}"
            assert seen[0]["headers"]["Content-Type"] == "application/json"
            assert "Content-Length" not in seen[3]["headers"] or seen[3]["headers"]["Content-Length"] == "0"
            # a refusal is an answer like any other: the caller reads the status
            status, body = await http.request("GET", "/refused", {})
            assert status == 403 and b"forbidden" in body
        finally:
            await http.close()


async def test_a_chunked_answer_is_joined_and_a_connection_close_is_honoured(certs, tmp_path):
    async with aiohttp_server(server_tls(certs, tmp_path)) as (port, _):
        http = ApiHttp(f"https://127.0.0.1:{port}", client_tls(certs))
        try:
            assert await http.request("GET", "/chunked", {}) == (200, b'{"items":[1,2,3]}')
            assert await http.request("GET", "/closing", {}) == (200, b"bye")
            assert http.opened == 1
            assert await http.request("GET", "/chunked", {}) == (200, b'{"items":[1,2,3]}')
            assert http.opened == 2  # the server said it closes: a new connection
        finally:
            await http.close()


async def test_a_kept_alive_connection_the_server_closed_is_opened_again_once():
    """The API server closes idle connections: the next request finds a closed one, gets nothing back, and is
    sent once more on a new connection."""

    async def one_answer_then_close(reader, writer):  # as a server whose idle timeout has passed
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async with raw_server(one_answer_then_close) as port:
        http = ApiHttp(f"http://127.0.0.1:{port}", None)
        try:
            for _ in range(3):
                assert await http.request("POST", "/events", {}, b"{}") == (200, b"ok")
            assert http.opened == 3
        finally:
            await http.close()


async def test_an_answer_cut_short_is_an_error_and_is_not_sent_again():
    requests = []

    async def half_an_answer(reader, writer):
        requests.append(await read_request(reader))
        writer.write(b'HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{"kind":')
        await writer.drain()
        writer.close()

    async with raw_server(half_an_answer) as port:
        http = ApiHttp(f"http://127.0.0.1:{port}", None)
        with pytest.raises(ApiHttpError, match="closed the connection mid-answer"):
            await http.request("POST", "/events", {}, b"{}")
        assert len(requests) == 1  # a POST the server may have acted on is not repeated
        await http.close()


async def test_an_answer_that_is_not_http_is_named_and_a_fresh_connection_never_retried():
    async def garbage(reader, writer):
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()

    async def silent_close(reader, writer):
        await read_request(reader)
        writer.close()

    async with raw_server(garbage) as port:
        http = ApiHttp(f"http://127.0.0.1:{port}", None)
        with pytest.raises(ApiHttpError, match=r"not HTTP/1\.1"):
            await http.request("GET", "/api", {})
        await http.close()
    async with raw_server(silent_close) as port:
        http = ApiHttp(f"http://127.0.0.1:{port}", None)
        with pytest.raises(ApiHttpError, match="closed the connection without an answer"):
            await http.request("GET", "/api", {})
        assert http.opened == 1
        await http.close()


async def test_no_answer_within_the_deadline_is_a_timeout_and_the_connection_is_dropped():
    answers = [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]

    async def first_never_answers(reader, writer):
        await read_request(reader)
        writer.write(answers.pop(0))
        await writer.drain()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.read()  # held open until the client gives up

    async with raw_server(first_never_answers) as port:
        http = ApiHttp(f"http://127.0.0.1:{port}", None, timeout_s=0.05)
        with pytest.raises(TimeoutError):
            await http.request("GET", "/api", {})
        http.timeout_s = 10.0
        assert await http.request("GET", "/api", {}) == (200, b"ok")
        assert http.opened == 2  # the timed-out connection was not reused
        await http.close()


async def test_through_a_connect_proxy_with_its_credentials(certs, tmp_path):
    asked: list[bytes] = []

    async def proxy(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        asked.append(head)
        host, port = head.split(b" ")[1].decode().rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(src, dst):
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def refusing_proxy(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
        await writer.drain()
        writer.close()

    async with aiohttp_server(server_tls(certs, tmp_path)) as (port, seen):
        async with raw_server(proxy) as proxy_port:
            http = ApiHttp(
                f"https://127.0.0.1:{port}",
                client_tls(certs),
                proxy=f"http://ops:s%40cret@127.0.0.1:{proxy_port}",
                proxy_headers={"X-Team": "gpu"},
            )
            try:
                for _ in range(2):
                    assert await http.request("POST", "/echo", {}, b"x") == (201, b'{"got": "x"}')
                assert http.opened == 1
            finally:
                await http.close()
        [connect] = asked
        assert connect.startswith(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n".encode())
        assert b"Proxy-Authorization: Basic " + base64.b64encode(b"ops:s@cret") in connect
        assert b"X-Team: gpu" in connect
        assert len(seen) == 2
        async with raw_server(refusing_proxy) as proxy_port:
            http = ApiHttp(
                f"https://127.0.0.1:{port}", client_tls(certs), proxy=f"http://127.0.0.1:{proxy_port}"
            )
            with pytest.raises(ApiHttpError, match=r"refused CONNECT .*407 Proxy Authentication Required"):
                await http.request("GET", "/echo", {})
            await http.close()


def test_an_address_that_is_not_http_is_refused_up_front():
    with pytest.raises(ValueError, match="expected https://host"):
        ApiHttp("unix:///var/run/kube.sock", None)
