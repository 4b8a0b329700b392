"""The webhook's end of the direct ledger channel (gpuledger.ray.channel): one socket, calls pipelined.

Requests carry a sequence number and may overlap (admissions, lookups and claims each have their own
batcher); one reader task hands each answer to its caller. Any failure closes the channel and fails every
call in flight with ChannelError, and the ledger client re-sends them through Ray: an admission is keyed by
the request's id and a claim by the request's uid, so a call the actor did run answers the same again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from gpuledger.ray.channel import (
    NONCE_BYTES,
    ChannelError,
    ChannelInfo,
    client_reply,
    decode,
    encode,
    frame,
    read_frame,
)


class LedgerChannel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, incarnation: str):
        self.reader, self.writer, self.incarnation = reader, writer, incarnation
        self.pending: dict[int, asyncio.Future] = {}
        self.seq = 0
        self.closed = False
        self.reader_task = asyncio.get_running_loop().create_task(self._read_answers())

    @classmethod
    async def connect(cls, info: ChannelInfo, timeout_s: float = 1.0) -> LedgerChannel:
        """Connect and prove the token both ways; ChannelError when the peer is not the actor."""
        token = bytes.fromhex(info["token"])
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(info["host"], info["port"])
                try:
                    nonce = os.urandom(NONCE_BYTES)
                    writer.write(frame(nonce))
                    await writer.drain()
                    answer = await read_frame(reader)
                    writer.write(client_reply(token, nonce, answer, f"{info['host']}:{info['port']}"))
                    await writer.drain()
                except BaseException:
                    writer.close()
                    raise
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            raise ChannelError(f"ledger channel {info['host']}:{info['port']}: {exc!r}") from exc
        return cls(reader, writer, info["incarnation"])

    async def call(self, method: str, *args: Any) -> Any:
        if self.closed:
            raise ChannelError("ledger channel closed")
        self.seq += 1
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending[self.seq] = future
        try:
            self.writer.write(frame(encode((self.seq, method, args))))
        except Exception as exc:
            self.pending.pop(self.seq, None)
            self._fail(ChannelError(f"ledger channel write: {exc!r}"))
            raise ChannelError(f"ledger channel write: {exc!r}") from exc
        ok, result = await future
        if not ok:
            raise RuntimeError(f"ledger {method} failed: {result}")
        return result

    async def _read_answers(self) -> None:
        try:
            while True:
                seq, ok, result = decode(await read_frame(self.reader))
                future = self.pending.pop(seq, None)
                if future is not None and not future.done():
                    future.set_result((ok, result))
        except asyncio.CancelledError:
            self._fail(ChannelError("ledger channel closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - EOF, a reset, a frame that does not decode: all end it
            self._fail(ChannelError(f"ledger channel closed: {exc!r}"))

    def _fail(self, exc: ChannelError) -> None:
        self.closed = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(exc)
        self.pending.clear()
        self.writer.close()

    async def close(self) -> None:
        if not self.reader_task.done():
            self.reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ChannelError):
                await self.reader_task
        self._fail(ChannelError("ledger channel closed"))
