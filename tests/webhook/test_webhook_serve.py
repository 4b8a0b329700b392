"""`gpuledger serve` as a process: local Ray, the ledger actor from a cluster file, TLS, probes, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpuledger.certs.pki import make_ca, make_serving_cert, write_bundle
from gpuledger.webhook.admission.review import decode_patch, make_review
from gpuledger.webhook.config import WebhookConfig
from tests.webhook.webhook_support import cluster, gpu_pod

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_config_file_accepts_snake_and_camel_case(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "bindingMode": "nodeName",
                "visibility_mode": "host-indices",
                "failOpen": True,
                "deadline_s": 1.5,
                "privilegedUsernames": ["a", "b"],
            }
        )
    )
    cfg = WebhookConfig.from_file(path)
    assert (cfg.binding_mode.value, cfg.visibility_mode, cfg.fail_open, cfg.deadline_s) == (
        "nodeName",
        "host-indices",
        True,
        1.5,
    )
    assert cfg.privileged_usernames == ("a", "b")
    path.write_text("bogus_key: 1\n")
    with pytest.raises(ValueError, match="bogus_key"):
        WebhookConfig.from_file(path)


@pytest.mark.ray
@pytest.mark.slow
def test_serve_process_end_to_end(tmp_path):
    ca = make_ca()
    paths = write_bundle(tmp_path / "tls", ca, make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump_all(cluster(2, 8)))
    key_file = tmp_path / "hmac"
    key_file.write_text("serve-test-key\n")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({"binding_mode": "both", "deadline_s": 5}))
    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuledger",
            "serve",
            "--port",
            str(port),
            "--tls-cert",
            str(paths["tls.crt"]),
            "--tls-key",
            str(paths["tls.key"]),
            "--cluster",
            str(cluster_file),
            "--config",
            str(config_file),
            "--hmac-key-file",
            str(key_file),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(f"{base}/readyz", context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "serve did not become ready"
            time.sleep(0.5)
        body = json.dumps(make_review(gpu_pod(2), uid="serve-1")).encode()
        req = urllib.request.Request(
            f"{base}/mutate", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["response"]["uid"] == "serve-1" and answer["response"]["allowed"]
        paths_patched = {op["path"] for op in decode_patch(answer)}
        assert "/spec/nodeName" in paths_patched and "/spec/affinity" in paths_patched  # binding_mode: both
        with urllib.request.urlopen(f"{base}/metrics", context=ctx, timeout=10) as resp:
            text = resp.read().decode()
        assert "agentaflow_gpu_total 16.0" in text and "agentaflow_workloads_pending 1.0" in text
        # the admission went over the ledger channel, and the actor counted its own time on it
        assert 'gpuledger_ledger_actor_calls_total{method="admit"} 1.0' in text
        [busy] = [
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith('gpuledger_ledger_actor_call_seconds_total{method="admit"}')
        ]
        assert 0 < busy < 5
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    assert f"listening on https://127.0.0.1:{port}" in out
