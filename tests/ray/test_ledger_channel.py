"""The direct ledger channel (gpuledger.ray.channel) into a real Ray actor: answers, trust, fallback.

One local Ray for the module (test_actor's fixture); each test has its own actor.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid

import pytest
import ray

from gpuledger.core.model import Placement, Request
from gpuledger.ray.actor import get_or_create_ledger, wait_ready
from gpuledger.ray.channel import NONCE_BYTES, ChannelError, channel_host, frame, read_frame
from gpuledger.service.ledger_service import AdmitCall
from gpuledger.service.sync_writer import SyncFenced
from gpuledger.sync.channel import ChannelLedgerTarget, ray_channel_opener
from gpuledger.sync.targets import RayLedgerTarget
from gpuledger.webhook.ledger.channel import LedgerChannel
from gpuledger.webhook.ledger.client import RayLedgerClient
from tests.ray.test_actor import ray_local, write_objects  # noqa: F401 - ray_local: a fixture
from tests.webhook.webhook_support import cluster, config

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def new_actor(tmp_path, nodes: int = 2):
    source = tmp_path / f"cluster-{uuid.uuid4().hex[:6]}.yaml"
    write_objects(source, cluster(nodes, 8))
    handle = get_or_create_ledger(
        config().ledger_config(),
        {"kind": "file", "path": str(source)},
        name=f"channel-{uuid.uuid4().hex[:8]}",
        namespace="gpuledger-test",
    )
    wait_ready(handle)
    return handle


def admit(rid: str, gpus: int = 1) -> AdmitCall:
    return AdmitCall(Request(id=rid, gpus=gpus))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_channel_answers_as_ray_does_and_serves_only_admission_calls(tmp_path):
    handle = new_actor(tmp_path)
    here = ray.get_runtime_context().get_node_id()
    info = await handle.open_channel.remote("auto", here)  # a caller on the actor's node: loopback
    assert info["host"] == "127.0.0.1" and info["node_id"] == here
    channel = await LedgerChannel.connect(info)
    try:
        [placed] = await channel.call("admit", [admit("a", 2)])
        assert isinstance(placed, Placement) and len(placed.devices) == 2
        [held] = await channel.call("claim", [("a", "uid-a")])
        assert held.placement == placed and held.claimed is False
        [same] = await handle.lookup.remote(["a"])  # what the channel did, Ray sees: one actor, one ledger
        assert same.placement == placed and same.claimed is True
        with pytest.raises(RuntimeError, match="'resync' is not served on the channel"):
            await channel.call("resync", [])
        pipelined = await asyncio.gather(*(channel.call("admit", [admit(f"p{i}")]) for i in range(14)))
        denials = [p.message for [p] in pipelined if not isinstance(p, Placement)]
        assert not denials, denials
        held_devices = [(p.node, d) for [p] in [*pipelined, [placed]] for d in p.devices]
        assert len(held_devices) == len(set(held_devices)) == 16  # every GPU once, pipelined or not
        [denied] = await channel.call("admit", [admit("one-too-many")])
        assert "not enough GPUs" in denied.message
    finally:
        await channel.close()
    assert (await handle.status.remote())["channel_connections"] == 1
    # what the actor spent on them, by method; a method it does not serve counts as "other"
    served = (await handle.stats.remote()).served
    assert served.calls == {"admit": 16, "claim": 1, "other": 1}
    assert set(served.seconds) == set(served.calls) and all(s > 0 for s in served.seconds.values())
    assert served.incarnation == (await handle.status.remote())["incarnation"]


async def test_a_peer_without_the_token_is_refused_and_an_impostor_is_not_believed(tmp_path):
    handle = new_actor(tmp_path)
    info = await handle.open_channel.remote("loopback")
    with pytest.raises(ChannelError):
        channel = await LedgerChannel.connect({**info, "token": os.urandom(32).hex()})
        await channel.call("admit", [admit("x")])  # the actor closed the socket after the bad proof
    assert (await handle.lookup.remote(["x"])) == [None]

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)
        writer.write(frame(os.urandom(NONCE_BYTES + 32)))  # cannot prove a token it never had
        await writer.drain()
        writer.close()

    garbled = await LedgerChannel.connect(info)  # a peer with the token sends a frame that does not decode
    garbled.writer.write(frame(b"not a pickle"))
    await asyncio.wait_for(garbled.reader_task, 10)  # the actor closes that connection ...
    with pytest.raises(ChannelError):
        await garbled.call("admit", [admit("y")])
    healthy = await LedgerChannel.connect(info)  # ... and goes on serving the others
    try:
        [placed] = await healthy.call("admit", [admit("z")])
        assert isinstance(placed, Placement)
    finally:
        await healthy.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ChannelError, match="did not prove the ledger's token"):
            await LedgerChannel.connect({**info, "port": port})
    finally:
        server.close()


async def test_client_falls_back_to_ray_while_the_channel_fails_and_retries_it_later(tmp_path):
    handle = new_actor(tmp_path)
    clock = Clock()
    client = RayLedgerClient(handle, clock=clock, channel_retry_s=5.0)
    try:
        first = await client.admit(admit("a"))
        assert isinstance(first, Placement) and client.channel_calls == 1
        broken = client.channel

        def reset(data):
            raise ConnectionResetError("connection reset by peer")

        broken.writer.write = reset  # the socket dies under the call (a network fault, a killed peer)
        second = await client.admit(admit("b"))
        assert isinstance(second, Placement) and client.channel_calls == 1  # answered through Ray
        assert client.channel is None and client.channel_failed_at == clock.now
        third = await client.admit(admit("c"))  # inside channel_retry_s: Ray again, no reconnect storm
        assert isinstance(third, Placement) and client.channel_calls == 1
        clock.now += 5.0
        fourth = await client.admit(admit("d"))
        assert isinstance(fourth, Placement) and client.channel_calls == 2 and client.channel is not broken
        devices = [(p.node, d) for p in (first, second, third, fourth) for d in p.devices]
        assert len(set(devices)) == 4
        assert client.transport_calls["channel"] == 2  # what /metrics exports as gpuledger_ledger_calls_total
        assert client.transport_calls["ray"] >= 2  # b and c (and the open_channel asks are not counted)
    finally:
        await client.close()


async def test_a_restarted_actor_gets_a_new_channel_with_its_own_token(tmp_path):
    handle = new_actor(tmp_path)
    client = RayLedgerClient(handle)
    try:
        assert isinstance(await client.admit(admit("a")), Placement)
        old = client.channel
        ray.kill(handle, no_restart=False)
        await asyncio.wait_for(old.reader_task, 60)  # the dead actor's socket closes
        assert old.closed
        placed = await client.admit(admit("b"))  # opens the successor's channel (Ray waits out the restart)
        assert isinstance(placed, Placement) and client.channel_calls == 2
        assert client.channel.incarnation == await handle.ping.remote() != old.incarnation
    finally:
        await client.close()


async def test_channel_off_uses_ray_calls_only(tmp_path):
    handle = new_actor(tmp_path)
    client = RayLedgerClient(handle, channel="off")
    placed = await client.admit(admit("a"))
    held = await client.claim("a", "uid-a")
    assert isinstance(placed, Placement) and held.placement == placed
    assert client.channel_calls == 0 and (await handle.status.remote())["channel_connections"] == 0
    with pytest.raises(ValueError, match="'tcp': expected one of auto, loopback, node-ip, off"):
        RayLedgerClient(handle, channel="tcp")


def placed_pod(name: str, placement: Placement) -> dict:
    """A stored pod carrying `placement`, as the cluster sync's watch reports it."""
    from gpuledger.core.pods.placement_codec import encode_placement
    from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY

    annotation = encode_placement(placement, config().hmac_key)
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {PLACEMENT_ANNOTATION: annotation},
            "labels": {RESERVATION_ID_KEY: placement.id},
        },
        "spec": {"nodeName": placement.node, "containers": [{"name": "m"}]},
        "status": {"phase": "Pending"},
    }


def test_the_sync_target_sends_its_calls_over_the_channel_and_resyncs_through_ray(tmp_path):
    handle = new_actor(tmp_path)
    target = ChannelLedgerTarget(RayLedgerTarget(handle), ray_channel_opener(handle, "auto"))
    try:
        lease = target.sync_lease("sync-a", 30.0)  # the lease thread's calls: through Ray
        assert lease["held"] and not lease["listed"] and target.calls == {"channel": 0, "ray": 0}
        [placed] = ray.get(handle.admit.remote([admit("a")]))
        with pytest.raises(SyncFenced, match="SyncFenced: apply_events from 'sync-a' before its full list"):
            target.apply_events([("ADDED", placed_pod("pod-a", placed))], "sync-a")
        target.resync(cluster(2, 8), "sync-a")  # large and rare: through Ray
        assert target.calls == {"channel": 0, "ray": 0} and target.status()["rebuilds"] == 2
        [placed] = ray.get(handle.admit.remote([admit("a")]))
        assert target.apply_events([("ADDED", placed_pod("pod-a", placed))], "sync-a") == 1
        [held] = ray.get(handle.lookup.remote(["a"]))
        assert held.confirmed  # the stored pod's event confirmed the reservation, over the channel
        [second] = ray.get(handle.admit.remote([admit("b")]))
        assert target.expiry_candidates(time.time() + 3600) == ["b"]
        assert target.release(["b"], "sync-a") == [True] and ray.get(handle.lookup.remote(["b"])) == [None]
        status = target.status()
        assert status["channel_connections"] == 1 and status["synced"] is True
        assert status["sync_holder"] == "sync-a" and status["sync_listed"] is True
        assert target.calls == {"channel": 5, "ray": 0}
        with pytest.raises(SyncFenced, match="SyncFenced: release from 'sync-b'"):
            target.release(["a"], "sync-b")  # another replica's sync, standing by, is refused
        assert ray.get(handle.lookup.remote(["a"]))[0].confirmed
    finally:
        target.close()


def test_the_sync_targets_threads_take_the_channel_in_turn(tmp_path):
    """The forwarding thread and the queue status writer share one target: their calls, made at once from
    several threads, each get their own answer over the one connection, and the channel stays up."""
    import threading

    handle = new_actor(tmp_path)
    target = ChannelLedgerTarget(RayLedgerTarget(handle), ray_channel_opener(handle, "auto"))
    answers: dict[str, list] = {"status": [], "candidates": [], "queues": []}
    errors: list[BaseException] = []

    def repeat(name: str, call) -> None:
        try:
            for _ in range(150):
                answers[name].append(call())
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [
            threading.Thread(target=repeat, args=("status", target.status)),
            threading.Thread(target=repeat, args=("candidates", lambda: target.expiry_candidates(0.0))),
            threading.Thread(target=repeat, args=("queues", lambda: target.queue_status(None))),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert all(isinstance(a, dict) and "ready" in a for a in answers["status"])
        assert answers["candidates"] == [[]] * 150 and answers["queues"] == [{}] * 150
        assert target.calls == {"channel": 450, "ray": 0} and target.channel is not None
    finally:
        target.close()


def test_the_sync_target_falls_back_to_ray_while_the_channel_fails(tmp_path):
    handle = new_actor(tmp_path)
    clock = Clock()
    opener = ray_channel_opener(handle, "loopback")
    target = ChannelLedgerTarget(RayLedgerTarget(handle), opener, retry_s=5.0, clock=clock)
    try:
        assert target.status()["ready"] and target.calls == {"channel": 1, "ray": 0}
        target.channel.sock.shutdown(socket.SHUT_RDWR)  # the socket dies under the sync's thread
        assert target.confirm(["nothing"], None) == [False]  # answered through Ray
        assert target.calls == {"channel": 1, "ray": 1} and target.channel is None
        assert target.failed_at == clock.now
        target.release(["nothing"], None)  # inside retry_s: Ray again
        assert target.calls == {"channel": 1, "ray": 2}
        clock.now += 5.0
        target.status()  # the channel again
        assert target.calls == {"channel": 2, "ray": 2} and target.channel is not None
    finally:
        target.close()
    impostor = ChannelLedgerTarget(
        RayLedgerTarget(handle), lambda: {**opener(), "token": os.urandom(32).hex()}, clock=clock
    )
    assert impostor.status()["ready"] and impostor.calls == {"channel": 0, "ray": 1}  # no proof, no channel


def test_where_the_actor_listens_for_each_mode_and_caller():
    """`auto`: loopback for a caller on the actor's Ray node, the node's IP for one elsewhere (the prod
    overlay's webhook pods); this machine has one Ray node, so the cross-node paths are checked here, not over
    a socket."""

    def ip() -> str:
        return "10.0.0.7"

    assert channel_host("auto", "node-a", "node-a", ip) == "127.0.0.1"
    assert channel_host("auto", "node-b", "node-a", ip) == "10.0.0.7"
    assert (
        channel_host("auto", "", "node-a", ip) == "10.0.0.7"
    )  # a caller that names no node: the routable one
    assert channel_host("loopback", "node-b", "node-a", ip) == "127.0.0.1"
    assert channel_host("node-ip", "node-a", "node-a", ip) == "10.0.0.7"
    for mode in ("off", "tcp"):
        with pytest.raises(ValueError, match=f"ledger_channel='{mode}': expected auto, loopback or node-ip"):
            channel_host(mode, "node-a", "node-a", ip)


def test_the_sync_channel_ends_on_an_answer_that_does_not_decode():
    """A peer that proves the token and then answers garbage: the sync's channel is done (ChannelError, so the
    target goes to Ray) rather than reading later frames out of step."""
    import threading

    from gpuledger.ray.channel import proof
    from gpuledger.sync.channel import BlockingChannel

    token = os.urandom(32)
    listener = socket.create_server(("127.0.0.1", 0))

    def peer() -> None:
        conn, _ = listener.accept()
        with conn:
            client_nonce = conn.recv(4 + NONCE_BYTES)[4:]
            server_nonce = os.urandom(NONCE_BYTES)
            conn.sendall(frame(server_nonce + proof(token, b"server", client_nonce)))
            conn.recv(4 + 32)  # the client's proof
            conn.recv(65536)  # the call
            conn.sendall(frame(b"not a pickle"))

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    info = {"host": "127.0.0.1", "port": listener.getsockname()[1], "token": token.hex(), "node_id": "n",
            "incarnation": "i"}  # fmt: skip
    channel = BlockingChannel(info, timeout_s=5)  # type: ignore[arg-type]
    try:
        with pytest.raises(ChannelError, match="ledger channel status"):
            channel.call("status")
    finally:
        channel.close()
        listener.close()
        thread.join(5)


async def test_placements_admitted_ahead_through_the_real_actor(tmp_path):
    """gpuledger.webhook.ledger.prefetch over the channel: the second pod of a shape takes a placement the
    actor made ahead,
    its claim passes in the actor, and what is not taken goes back to the actor when the webhook stops."""
    from gpuledger.webhook.admission.handler import AdmissionHandler
    from tests.webhook.webhook_support import apply_patch, gpu_pod, review

    handle = new_actor(tmp_path)
    client = RayLedgerClient(handle)
    h = AdmissionHandler(config(prefetch_depth=2), client)
    try:
        first = await h.mutate(review(gpu_pod(1)))
        assert first.allowed and first.ledger_batch >= 1
        for _ in range(100):  # the fill is a background call: wait for its answer, not for a fixed time
            if h.prefetch.held == 2:
                break
            await asyncio.sleep(0.01)
        assert h.prefetch.held == 2
        # the pod's own admission, then the two placements ahead in one call
        # (gpuledger.webhook.ledger.batcher)
        assert (client.admissions.calls, client.admissions.items) == (2, 3)
        pod = gpu_pod(1)
        second = await h.mutate(review(pod))
        assert second.allowed and second.ledger_batch == 0
        placed = apply_patch(pod, second.patch)
        assert (await h.validate(review(placed))).allowed  # the actor's claim of the prefetched reservation
        copy = await h.validate(review(placed))  # the same pod admitted again (another uid)
        assert not copy.allowed and "already admitted" in copy.message
        await h.prefetch.stop()
        assert h.prefetch.held == 0
        stats = await handle.stats.remote()
        assert stats.reservations_pending == 2  # the two pods' own: what was held ahead went back
        assert client.transport_calls["channel"] >= 3 and client.transport_calls["ray"] == 0
    finally:
        await client.close()
