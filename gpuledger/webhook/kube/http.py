"""One kept-alive HTTP/1.1 connection to the API server, one request at a time, on the running loop, with
answers parsed by httptools: what gpuledger.webhook.kube.api pools for the webhook's own requests (its Events,
the look-up of placed pods, the pods' owners).

aiohttp's client spends more CPU per Event POST than the mutating handler spends on an admission, in the
process and under the GIL that answer admissions; the same POST written on an asyncio TLS stream and parsed by
httptools (llhttp, the parser uvicorn uses) costs less than half of that
(tests/benchmarks/bench_api_requests.py; docs/benchmarks.md). A connection the server closed while it sat idle
is opened again and the request sent once more, but only when nothing of the answer had arrived. Through an
HTTP proxy (a kubeconfig's proxy-url) the connection is a CONNECT tunnel.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from urllib.parse import unquote, urlsplit

import httptools

READ_SIZE = 64 * 1024


class ApiHttpError(ConnectionError):
    """The connection failed, closed early or answered something that is not HTTP."""


class _Answer:
    """httptools' callbacks for one response. Whether the connection stays open is read as the answer
    completes: llhttp forgets it once the message is over."""

    __slots__ = ("body", "done", "keep_alive", "parser")

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.done = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        self.done = True
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()


class ApiHttp:
    """`request` over one connection to `base` (https://host:port or http://), opened on first use."""

    def __init__(
        self,
        base: str,
        tls: ssl.SSLContext | None,
        server_hostname: str | None = None,
        proxy: str | None = None,
        proxy_headers: dict[str, str] | None = None,
        timeout_s: float = 5.0,
    ):
        url = urlsplit(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(
                f"API server address {base!r}: expected https://host[:port] or http://host[:port]"
            )
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.authority = url.netloc.rsplit("@", 1)[-1]
        self.prefix = url.path.rstrip("/")  # an API server behind a path (kubectl proxy style)
        self.tls = tls if url.scheme == "https" else None
        self.server_hostname = server_hostname
        self.proxy, self.proxy_headers = proxy, dict(proxy_headers or {})
        self.timeout_s = timeout_s
        self.opened = 0  # connections made (tests read it)
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    async def request(
        self, method: str, target: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, bytes]:
        """(status, body) of one request; ApiHttpError or TimeoutError when none came back."""
        head = [f"{method} {self.prefix}{target} HTTP/1.1\r\nHost: {self.authority}\r\n"]
        head += [f"{name}: {value}\r\n" for name, value in headers.items()]
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}\r\n")
        message = "".join(head).encode("latin-1") + b"\r\n" + body
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout_s):
                    reused = self._stream is not None
                    try:
                        return await self._exchange(message)
                    except _NothingBack:
                        if not reused:
                            raise ApiHttpError(
                                f"{self.authority} closed the connection without an answer"
                            ) from None
                    try:  # the kept-alive connection had been closed while idle: a new one, once more
                        return await self._exchange(message)
                    except _NothingBack:
                        raise ApiHttpError(
                            f"{self.authority} closed the connection without an answer"
                        ) from None
            except BaseException:
                self._drop()  # a timeout or failure mid-answer leaves the connection in no known state
                raise

    async def _exchange(self, message: bytes) -> tuple[int, bytes]:
        if self._stream is None:
            self._stream = await self._connect()
        reader, writer = self._stream
        answer = _Answer()
        parser = answer.parser = httptools.HttpResponseParser(answer)
        got = False
        try:
            writer.write(message)
            while not answer.done:
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                got = True
                parser.feed_data(data)
        except (ConnectionError, OSError) as exc:
            self._drop()
            if not got:
                raise _NothingBack from exc
            raise ApiHttpError(f"{self.authority}: {exc!r}") from exc
        except httptools.HttpParserError as exc:
            self._drop()
            raise ApiHttpError(f"{self.authority} answered something that is not HTTP/1.1: {exc}") from exc
        if not answer.done:
            self._drop()
            if not got:
                raise _NothingBack
            raise ApiHttpError(f"{self.authority} closed the connection mid-answer")
        if not answer.keep_alive:
            self._drop()
        return parser.get_status_code(), b"".join(answer.body)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.opened += 1
        name = self.server_hostname or self.host
        try:
            if not self.proxy:
                return await asyncio.open_connection(
                    self.host, self.port, ssl=self.tls, server_hostname=name if self.tls else None
                )
            return await self._tunnel(name)
        except (OSError, ssl.SSLError) as exc:
            raise ApiHttpError(f"could not connect to {self.authority}: {exc!r}") from exc

    async def _tunnel(self, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A CONNECT tunnel through the proxy, then TLS (when the API server speaks it) inside it."""
        proxy = urlsplit(self.proxy or "")
        if proxy.scheme != "http" or not proxy.hostname:
            raise ApiHttpError(f"proxy {self.proxy!r}: only http:// proxies are supported")
        reader, writer = await asyncio.open_connection(proxy.hostname, proxy.port or 80)
        headers = dict(self.proxy_headers)
        if proxy.username is not None:
            userinfo = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
            headers.setdefault("Proxy-Authorization", "Basic " + base64.b64encode(userinfo).decode())
        target = f"{self.host}:{self.port}"
        lines = [f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"]
        lines += [f"{k}: {v}\r\n" for k, v in headers.items()]
        writer.write("".join(lines).encode("latin-1") + b"\r\n")
        try:
            status_line = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
        except (ConnectionError, OSError):
            writer.close()
            raise
        parts = status_line.split(None, 2)
        if len(parts) < 2 or parts[1] != b"200":
            writer.close()
            said = status_line.decode("latin-1", "replace").strip() or "no answer"
            raise ApiHttpError(f"proxy {proxy.hostname}:{proxy.port or 80} refused CONNECT {target}: {said}")
        if self.tls is not None:
            await writer.start_tls(self.tls, server_hostname=name)
        return reader, writer

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream[1].close()
            self._stream = None

    async def close(self) -> None:
        if self._stream is not None:
            writer = self._stream[1]
            self._drop()
            with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
                await writer.wait_closed()


class _NothingBack(Exception):
    """The connection ended before any byte of the answer (an idle keep-alive the server had closed)."""
