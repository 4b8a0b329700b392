"""The real node agent (`python -m gpuledger.node_agent`) as a process of its own beside a real node, its fake
probe reporting the fake device plugin's GPUs: what a DaemonSet pod would run on that node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devcluster.kubelet import RealNode
from devcluster.nodes import device_uuid
from devcluster.processes import stop_process

REPO = Path(__file__).resolve().parents[1]


class AgentProcess:
    """Starts, stops and restarts the agent for `node`; `processes` are fake GPU processes
    ([[INDEX, PID, MIB], ...]); the agent's output goes to `log` beside the kubelet's."""

    def __init__(
        self,
        kubeconfig: str | Path,
        node: RealNode,
        gpus: int,
        processes: list[list[int]] | None = None,
        product: str = "NVIDIA-H100",
        memory_mib: int = 81559,
        holders_interval_s: float = 0.5,
    ):
        self.kubeconfig, self.node, self.gpus = str(kubeconfig), node, gpus
        self.processes = list(processes or [])
        self.product, self.memory_mib, self.holders_interval_s = product, memory_mib, holders_interval_s
        self.proc: subprocess.Popen | None = None
        self.log = Path(node.kubelet_log).with_name("node-agent.log")

    def fake_spec(self) -> str:
        gpus = [
            {
                "index": i,
                "uuid": device_uuid(self.node.name, i),
                "product": self.product,
                "memory_mib": self.memory_mib,
                "healthy": True,
            }
            for i in range(self.gpus)
        ]
        return json.dumps({"gpus": gpus, "processes": self.processes})

    def start(self) -> AgentProcess:
        argv = [sys.executable, "-m", "gpuledger.node_agent", "--node", self.node.name]
        argv += ["--kubeconfig", self.kubeconfig, "--fake", self.fake_spec()]
        argv += ["--pod-resources-socket", str(self.node.pod_resources_socket)]
        argv += ["--interval", "30", "--holders-interval", str(self.holders_interval_s)]
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": path}
            )
        return self

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"the node agent exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def restart(self, processes: list[list[int]] | None = None) -> None:
        self.stop()
        if processes is not None:
            self.processes = list(processes)
        self.start()

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
