"""`gpuledger serve` as its own process against a control plane: the product exactly as deployed.

Its own TLS bundle (gpuledger/certs/pki.py), a config file with a signing key and the harness's webhook
identity,
the webhook identity's kubeconfig; `wait_ready()` polls its /readyz (ledger answering and synced).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from devcluster import webhooks
from devcluster.binaries import REPO, free_port
from devcluster.processes import stop_process
from devcluster.users import WEBHOOK_USER
from gpuledger.certs import pki

HMAC_KEY = "gpuledger-serve-test-key"


class ServedProcess:
    """A TLS server process, its URL, and GETs that trust our CA."""

    def __init__(self, argv: list[str], url: str, ca_file: str, log: Path):
        self.url, self.ca_file, self.log_path = url, ca_file, log
        self._log = open(log, "wb")  # noqa: SIM115 - the child writes to it until stop() closes it
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)

    def get(self, path: str) -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(self.url + path, context=ctx, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def wait(self, path: str = "/readyz", timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log_tail()}")
            if self.get(path)[0] == 200:
                return
            time.sleep(0.3)
        raise TimeoutError(f"{self.url}{path} not 200 after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self._log.closed:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def metric(self, name: str) -> float | None:
        """The first sample of an unlabelled metric from /metrics."""
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def stop(self, timeout: float = 20) -> int:
        stop_process(self.proc, grace_s=timeout)
        self._log.close()
        return self.proc.returncode


class GpuledgerServe(ServedProcess):
    """`python -m gpuledger serve --kubeconfig ...` with a fresh CA and serving certificate."""

    def __init__(self, cp, extra_config: dict | None = None, *args: str):
        self.workdir = Path(tempfile.mkdtemp(prefix="gpuledger-serve-"))
        self.ca = pki.make_ca("gpuledger-serve-test-ca")
        self.tls = pki.write_bundle(
            self.workdir, self.ca, pki.make_serving_cert(self.ca, ["localhost"], ["127.0.0.1"])
        )
        config = {"hmac_key": HMAC_KEY, "privileged_usernames": [WEBHOOK_USER], **(extra_config or {})}
        (self.workdir / "webhook.yaml").write_text(yaml.safe_dump(config))
        self.cp = cp
        port = free_port()
        super().__init__(
            [
                sys.executable,
                "-m",
                "gpuledger",
                "serve",
                "--port",
                str(port),
                "--tls-cert",
                str(self.tls["tls.crt"]),
                "--tls-key",
                str(self.tls["tls.key"]),
                "--kubeconfig",
                cp.kubeconfig_for(WEBHOOK_USER),
                "--config",
                str(self.workdir / "webhook.yaml"),
                "--log-level",
                "WARNING",
                *args,
            ],
            f"https://127.0.0.1:{port}",
            str(self.tls["ca.crt"]),
            self.workdir / "serve.log",
        )

    def register(self, failure_policy: str = "Fail", timeout_s: int = 10) -> None:
        webhooks.register(self.cp, self.url, self.ca.cert_pem, failure_policy, timeout_s)

    def stop(self, timeout: float = 20) -> int:
        rc = super().stop(timeout)
        self.final_log = self.log_path.read_text(errors="replace")[-5000:]
        shutil.rmtree(self.workdir, ignore_errors=True)
        return rc
