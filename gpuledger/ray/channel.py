"""A direct stream from a webhook replica into the ledger actor, for the calls on a pod's critical path
and the cluster sync's per-pod calls.

A Ray actor call costs 1-6 ms here whatever it carries (the caller's core worker, gRPC, the actor's task
queue); a frame on a kept-open socket costs tens of microseconds. Ray still owns the actor's life, its
restarts and where it runs: a replica asks the actor for the channel with one Ray call (`open_channel`), so
only a process that may call the actor learns the per-incarnation token, and it falls back to Ray calls
whenever the channel is closed or cannot be reached.

Frames: a 4-byte big-endian length, then the payload. The handshake proves both ends hold the token (a
process that took the port after the actor died learns nothing and is believed in nothing); after it, each
request is a pickled `(seq, method, args)` and each answer a pickled `(seq, ok, result)`: the same trust as
Ray's own pickled calls, given only to a peer that proved the token. Only `CHANNEL_METHODS` are served; the
rest go through Ray.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import pickle
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict

# the calls a pod's admission makes, and the cluster sync's frequent ones (gpuledger.sync.channel); every
# other actor method (resync, settings, stats, ...) is reached through Ray
CHANNEL_METHODS = frozenset(
    {
        "admit",
        "lookup",
        "claim",
        "apply_events",
        "confirm",
        "release",
        "expiry_candidates",
        "status",
        "place_waiting",
        "preemptions_due",
        "eviction_refused",
        "queue_status",
    }
)
# the `ledger_channel` setting: auto (127.0.0.1 from the actor's own Ray node, its node IP from others) |
# loopback (127.0.0.1 only: other nodes keep Ray calls) | node-ip (always the node IP) | off (Ray calls only)
CHANNEL_MODES = ("auto", "loopback", "node-ip", "off")
HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024
NONCE_BYTES = 16
PICKLE_PROTOCOL = 5

log = logging.getLogger("gpuledger.channel")


class ChannelInfo(TypedDict):
    """What `open_channel` answers: where to connect and the secret both ends prove."""

    host: str
    port: int
    token: str  # hex
    node_id: str  # the actor's Ray node (a loopback channel is usable only from the same node)
    incarnation: str


class ChannelError(ConnectionError):
    """The channel failed (closed, refused, a bad handshake): the caller falls back to Ray."""


def channel_host(mode: str, caller_node: str, node_id: str, node_ip: Callable[[], str]) -> str:
    """The address the actor listens on for a caller: `auto` gives 127.0.0.1 to a caller on the actor's own
    Ray node and the node's IP to one elsewhere; `loopback` and `node-ip` give theirs to everyone."""
    if mode not in CHANNEL_MODES or mode == "off":
        raise ValueError(f"ledger_channel={mode!r}: expected auto, loopback or node-ip")
    local = mode == "loopback" or (mode == "auto" and caller_node == node_id)
    return "127.0.0.1" if local else node_ip()


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ChannelError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return await reader.readexactly(size)


def proof(token: bytes, role: bytes, nonce: bytes) -> bytes:
    """One end's answer to the other's nonce: HMAC(token, role + nonce)."""
    return hmac.new(token, role + nonce, hashlib.sha256).digest()


def client_reply(token: bytes, nonce: bytes, answer: bytes, where: str) -> bytes:
    """The client's last handshake frame, given the server's `answer` to `nonce` (its own nonce, then its
    proof); ChannelError when the server did not prove the token."""
    server_nonce, server_proof = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
    if not hmac.compare_digest(server_proof, proof(token, b"server", nonce)):
        raise ChannelError(f"{where} did not prove the ledger's token")
    return frame(proof(token, b"client", server_nonce))


def check_reachable(mode: str, info: ChannelInfo, caller_node: str) -> None:
    """A `loopback` channel is usable only from the actor's own Ray node: ChannelError elsewhere."""
    if mode == "loopback" and info["node_id"] != caller_node:
        raise ChannelError("the ledger actor runs on another Ray node (ledger_channel: node-ip)")


def encode(value: Any) -> bytes:
    return pickle.dumps(value, protocol=PICKLE_PROTOCOL)


def decode(payload: bytes) -> Any:
    return pickle.loads(payload)  # only after the peer proved the token (module docstring)


Dispatch = Callable[[str, tuple], Awaitable[Any]]


class ChannelServer:
    """Serves CHANNEL_METHODS from inside the actor, on the actor's own event loop.

    Each request is dispatched to the actor's method in arrival order and answered before the next frame is
    read, so the ledger sees the same one-call-at-a-time order as Ray calls (the actor's methods never await,
    but for the cluster's writes queued behind a resync: a connection's calls stay in order then too).
    """

    def __init__(self, dispatch: Dispatch, token: bytes | None = None):
        self.dispatch = dispatch
        self.token = token or os.urandom(32)
        self.servers: dict[str, tuple[asyncio.Server, int]] = {}
        self.connections = 0
        self.refused = 0
        # per method: calls served and seconds spent on them, each from its frame read to its answer encoded
        # (a call that waits behind a rebuild counts its wait); methods not served count as "other". The write
        # is left out: it wakes the caller, and on a busy core the actor may lose its CPU right there, after
        # the answer has left (counted with the write, a claim read ~0.2-0.3 ms against ~0.07 ms without it)
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    async def listen(self, host: str) -> int:
        """The port of this host's listener, started on first use (an ephemeral port)."""
        if host not in self.servers:
            server = await asyncio.start_server(self._serve, host, 0)
            self.servers[host] = (server, server.sockets[0].getsockname()[1])
            log.info("ledger channel listening on %s:%d", host, self.servers[host][1])
        return self.servers[host][1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not await self._handshake(reader, writer):
                self.refused += 1
                return
            self.connections += 1
            while True:
                payload = await read_frame(reader)
                started = time.perf_counter()
                seq, method, args = decode(payload)
                try:
                    if method not in CHANNEL_METHODS:
                        raise ValueError(f"method {method!r} is not served on the channel")
                    answer = (seq, True, await self.dispatch(method, args))
                except Exception as exc:  # noqa: BLE001 - the caller raises it; one bad call keeps the channel
                    answer = (seq, False, f"{type(exc).__name__}: {exc}")
                answered = frame(encode(answer))
                self._served(method, time.perf_counter() - started)
                writer.write(answered)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ChannelError, TimeoutError):
            pass  # the peer went away, or never proved the token in time
        except Exception:  # a frame that does not decode: this connection ends, the actor goes on
            log.exception("ledger channel: closing a connection after a bad frame")
        finally:
            writer.close()

    def _served(self, method: str, seconds: float) -> None:
        name = method if method in CHANNEL_METHODS else "other"
        self.calls[name] = self.calls.get(name, 0) + 1
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        client_nonce = await asyncio.wait_for(read_frame(reader), 5.0)
        if len(client_nonce) != NONCE_BYTES:
            return False
        server_nonce = os.urandom(NONCE_BYTES)
        writer.write(frame(server_nonce + proof(self.token, b"server", client_nonce)))
        await writer.drain()
        answer = await asyncio.wait_for(read_frame(reader), 5.0)
        return hmac.compare_digest(answer, proof(self.token, b"client", server_nonce))

    def close(self) -> None:
        for server, _ in self.servers.values():
            server.close()
        self.servers.clear()
