"""A real aiohttp server over real TLS: certificates from gpuledger/certs/pki.py, rotation under load,
mTLS, TLS >= 1.2."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import aiohttp
import pytest
from cryptography import x509

from gpuledger.certs.pki import make_ca, make_client_cert, make_serving_cert, write_bundle
from gpuledger.webhook.admission.review import make_review
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.transport.app import create_app
from gpuledger.webhook.transport.server import start_server
from gpuledger.webhook.transport.tls import ReloadingTLS
from tests.webhook.webhook_support import Clock, cluster, config, gpu_pod, service


def client_context(ca_pem: bytes, client=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    if client is not None:
        ctx.load_cert_chain(*client)
    return ctx


async def peer_serial(port: int, ctx: ssl.SSLContext) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture
def bundle(tmp_path):
    ca = make_ca()
    serving = make_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    paths = write_bundle(tmp_path, ca, serving)
    return ca, serving, paths


async def serve(paths, client_ca=None, poll=0.05, **cfg):
    tls = ReloadingTLS(paths["tls.crt"], paths["tls.key"], client_ca, poll_interval_s=poll)
    app = create_app(config(**cfg), InProcessLedgerClient(service(cluster(8, 8)), Clock()))
    return await start_server(app, "127.0.0.1", 0, tls)


async def test_rotation_under_load_drops_nothing(bundle, tmp_path):
    ca, serving, paths = bundle
    server = await serve(paths)
    ctx = client_context(ca.cert_pem)
    failures, answered = [], [0]
    stop = asyncio.Event()

    async def load(worker: int):
        # a fresh connection now and then, so new handshakes meet each new certificate
        while not stop.is_set():
            conn = aiohttp.TCPConnector(ssl=ctx, force_close=worker % 2 == 0)
            async with aiohttp.ClientSession(connector=conn) as session:
                for i in range(20):
                    body = make_review(gpu_pod(None), uid=f"w{worker}-{i}")
                    try:
                        async with session.post(f"{server.url}/mutate", json=body) as resp:
                            data = await resp.json()
                            if resp.status != 200 or data["response"]["uid"] != body["request"]["uid"]:
                                failures.append((resp.status, data))
                            answered[0] += 1
                    except Exception as exc:  # any failure counts
                        failures.append(repr(exc))

    try:
        workers = [asyncio.create_task(load(w)) for w in range(4)]
        serials = {serving.cert.serial_number}
        for _ in range(5):
            await asyncio.sleep(0.3)
            new = make_serving_cert(ca, ["localhost"], ["127.0.0.1"])
            write_bundle(tmp_path, ca, new)
            for _ in range(100):  # the reloader polls every 50 ms
                if await peer_serial(server.port, ctx) == new.cert.serial_number:
                    break
                await asyncio.sleep(0.02)
            assert await peer_serial(server.port, ctx) == new.cert.serial_number
            serials.add(new.cert.serial_number)
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*workers)
    finally:
        await server.stop()
    assert failures == []
    assert answered[0] > 100 and len(serials) == 6
    assert server.tls.reloads == 5


async def test_a_mismatched_pair_keeps_the_previous_certificate(bundle, tmp_path):
    ca, serving, paths = bundle
    server = await serve(paths)
    try:
        other = make_serving_cert(ca, ["localhost"], ["127.0.0.1"])
        paths["tls.key"].write_bytes(other.key_pem)  # key changed, certificate not (yet)
        assert server.tls.check() is False and server.tls.failed_reloads == 1
        assert await peer_serial(server.port, client_context(ca.cert_pem)) == serving.cert.serial_number
        paths["tls.crt"].write_bytes(other.cert_pem)
        assert server.tls.check() is True
        assert await peer_serial(server.port, client_context(ca.cert_pem)) == other.cert.serial_number
    finally:
        await server.stop()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_tls_below_1_2_is_refused(bundle):
    ca, _, paths = bundle
    server = await serve(paths, poll=10)
    try:
        ctx = client_context(ca.cert_pem)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        with contextlib.suppress(ssl.SSLError):
            ctx.set_ciphers("ALL:@SECLEVEL=0")
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            await peer_serial(server.port, ctx)
        ctx12 = client_context(ca.cert_pem)
        ctx12.maximum_version = ssl.TLSVersion.TLSv1_2
        assert await peer_serial(server.port, ctx12)
    finally:
        await server.stop()


async def test_client_certificates_when_configured(bundle, tmp_path):
    ca, _, paths = bundle
    server = await serve(paths, client_ca=str(paths["ca.crt"]), poll=10)
    try:
        url = f"{server.url}/mutate"
        body = make_review(gpu_pod(1), uid="mtls")
        anonymous = client_context(ca.cert_pem)
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=anonymous)) as s,
                s.post(url, json=body) as resp,
            ):
                await resp.read()
        pair = make_client_cert(ca, "kube-apiserver")
        cert_file, key_file = tmp_path / "client.crt", tmp_path / "client.key"
        cert_file.write_bytes(pair.cert_pem)
        key_file.write_bytes(pair.key_pem)
        trusted = client_context(ca.cert_pem, (str(cert_file), str(key_file)))
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusted)) as s,
            s.post(url, json=body) as resp,
        ):
            data = await resp.json()
        assert data["response"]["uid"] == "mtls" and data["response"]["allowed"] is True
    finally:
        await server.stop()
