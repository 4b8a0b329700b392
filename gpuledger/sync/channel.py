"""The cluster sync's calls over the ledger channel: a blocking client for the sync's own thread.

Every stored, changed or deleted pod becomes an `apply_events` call. Over Ray each one costs the replica's
process a cloudpickle of the pods and a task submission in Python, on the same GIL as the admission loop, and
it lands exactly when the next pod's admission starts (the watch reports a pod as the API server answers its
create). Over the channel it is one C pickle and one socket write. The sync's thread has its own connection,
so the admission loop never carries the sync's frames. Any failure falls back to Ray calls for `retry_s`
(the `clock` is an input); a re-sent call is safe: events are applied by object (a pod seen twice is the same
pod), confirm/release by id.

Two of the sync's threads call the ledger: the forwarding thread, and the queue status writer every few
seconds (gpuledger.sync.queue_status). Their calls take the one connection in turn, under a lock: two calls'
frames interleaved on one socket would leave each reading the other's answer.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuledger.ray.channel import (
    HEADER,
    MAX_FRAME,
    NONCE_BYTES,
    ChannelError,
    ChannelInfo,
    check_reachable,
    client_reply,
    decode,
    encode,
    frame,
)
from gpuledger.service.sync_writer import SyncFenced
from gpuledger.sync.targets import CallingTarget

FENCED = f"{SyncFenced.__name__}: "  # how the actor's channel answers a refusal: "Type: message"

log = logging.getLogger("gpuledger.sync")


def ray_channel_opener(handle: Any, mode: str, timeout_s: float = 60.0) -> Callable[[], ChannelInfo]:
    """Asks the actor (one Ray call) where its channel listens for this process, as the webhook does."""

    def open_channel() -> ChannelInfo:
        import ray

        here = ray.get_runtime_context().get_node_id()
        info: ChannelInfo = ray.get(handle.open_channel.remote(mode, here), timeout=timeout_s)
        check_reachable(mode, info, here)
        return info

    return open_channel


class BlockingChannel:
    """One socket to the actor's channel, one call at a time (the sync's thread is its only user)."""

    def __init__(self, info: ChannelInfo, timeout_s: float = 60.0):
        self.info, self.seq = info, 0
        token = bytes.fromhex(info["token"])
        try:
            self.sock = socket.create_connection((info["host"], info["port"]), timeout=timeout_s)
        except OSError as exc:
            raise ChannelError(f"ledger channel {info['host']}:{info['port']}: {exc!r}") from exc
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.urandom(NONCE_BYTES)
            self.sock.sendall(frame(nonce))
            self.sock.sendall(
                client_reply(token, nonce, self._read_frame(), f"{info['host']}:{info['port']}")
            )
        except BaseException as exc:
            self.sock.close()
            if isinstance(exc, OSError) and not isinstance(exc, ChannelError):
                raise ChannelError(f"ledger channel handshake: {exc!r}") from exc
            raise

    def _read_exactly(self, size: int) -> bytes:
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ChannelError("ledger channel closed by the actor")
            got += n
        return bytes(buf)

    def _read_frame(self) -> bytes:
        (size,) = HEADER.unpack(self._read_exactly(HEADER.size))
        if size > MAX_FRAME:
            raise ChannelError(f"frame of {size} bytes exceeds {MAX_FRAME}")
        return self._read_exactly(size)

    def call(self, method: str, *args: Any) -> Any:
        """The actor's answer; ChannelError when the socket fails (the channel is then unusable)."""
        self.seq += 1
        try:
            self.sock.sendall(frame(encode((self.seq, method, args))))
            seq, ok, result = decode(self._read_frame())
        except ChannelError:
            raise
        # a reset, a timeout, a frame cut short or one that does not decode: the stream can no longer be
        # trusted to be aligned, so the channel is done (the caller closes it and goes to Ray)
        except Exception as exc:
            raise ChannelError(f"ledger channel {method}: {exc!r}") from exc
        if seq != self.seq:
            raise ChannelError(f"ledger channel answered call {seq}, expected {self.seq}")
        if not ok:
            if str(result).startswith(FENCED):  # the lease's refusal, as the same type a Ray call raises
                raise SyncFenced(f"ledger {method} failed: {result}")
            raise RuntimeError(f"ledger {method} failed: {result}")
        return result

    def close(self) -> None:
        self.sock.close()


class ChannelLedgerTarget(CallingTarget):
    """A `LedgerTarget` whose frequent calls go over the channel; `resync` (rare, large) and every call while
    the channel is unusable go to `ray_target`."""

    def __init__(
        self,
        ray_target: Any,
        open_channel: Callable[[], ChannelInfo],
        retry_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        connect: Callable[[ChannelInfo], BlockingChannel] = BlockingChannel,
    ):
        self.ray_target, self.open_channel = ray_target, open_channel
        self.retry_s, self.clock, self.connect = retry_s, clock, connect
        self.channel: BlockingChannel | None = None
        self.failed_at: float | None = None
        self.calls = {"channel": 0, "ray": 0}
        self._lock = threading.Lock()  # one call on the channel at a time, whichever thread makes it

    def _channel(self) -> BlockingChannel | None:
        if self.channel is not None:
            return self.channel
        if self.failed_at is not None and self.clock() - self.failed_at < self.retry_s:
            return None
        try:
            self.channel = self.connect(self.open_channel())
        except Exception as exc:  # noqa: BLE001 - any failure (Ray, refused, bad proof): Ray until the retry
            self._down(exc)
            return None
        self.failed_at = None
        log.info("sync: ledger channel open to %s:%s", self.channel.info["host"], self.channel.info["port"])
        return self.channel

    def _down(self, exc: BaseException) -> None:
        if self.failed_at is None:
            log.warning("sync: ledger channel unusable, using Ray calls: %s", exc)
        self.failed_at = self.clock()
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            channel = self._channel()
            if channel is not None:
                try:
                    answer = channel.call(method, *args)
                    self.calls["channel"] += 1
                    return answer
                except ChannelError as exc:
                    self._down(exc)
            self.calls["ray"] += 1
        return getattr(self.ray_target, method)(*args)

    def resync(self, objects, holder):  # large and rare: Ray's object transfer, not a frame
        return self.ray_target.resync(objects, holder)

    def sync_lease(self, holder, term_s, hand_back=False):
        # the sync's lease thread, beside the forwarding thread that owns the channel: Ray, a call per renewal
        return self.ray_target.sync_lease(holder, term_s, hand_back)

    def close(self) -> None:
        with self._lock:
            if self.channel is not None:
                self.channel.close()
                self.channel = None
