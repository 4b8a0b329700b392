"""The kubelet's own gRPC APIs for the test node: the product's stubs (gpuledger/node_agent/kubelet_grpc.py,
from its vendored .proto files), plus the Go module those files come from, for the test that they still match.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from gpuledger.node_agent.kubelet_grpc import (
    KUBELET_MODULE,
    PACKAGE,
    PROTOS,
    PROTOS_DIR,
    KubeletApiError,
    generate,
    generated_dir,
    load,
    strip_gogo,
    vendored,
)

__all__ = [
    "KUBELET_MODULE",
    "PACKAGE",
    "PROTOS",
    "PROTOS_DIR",
    "KubeletApiError",
    "generate",
    "generated_dir",
    "kubelet_module_dir",
    "load",
    "strip_gogo",
    "vendored",
]


def kubelet_module_dir(module: str = KUBELET_MODULE) -> Path:
    """`go mod download -json k8s.io/kubelet@v0.X.Y`: the module's folder in Go's module cache."""
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", GOSUMDB=os.environ.get("GOSUMDB", "off"))
    with tempfile.TemporaryDirectory() as empty:  # outside any module, so no go.mod is read or changed
        proc = subprocess.run(
            ["go", "mod", "download", "-json", module],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    try:
        info = json.loads(proc.stdout)
    except ValueError as err:
        raise KubeletApiError(
            f"go mod download {module} exited {proc.returncode}: {proc.stderr.strip()}"
        ) from err
    if info.get("Error") or not info.get("Dir"):
        raise KubeletApiError(f"go mod download {module}: {info.get('Error')}")
    return Path(info["Dir"])
