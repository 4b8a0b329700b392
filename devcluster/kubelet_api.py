"""The kubelet's own gRPC APIs in Python: device plugin v1beta1 and pod resources v1, generated with
grpcio-tools from the .proto files of the k8s.io/kubelet Go module (fetched through the Go module proxy) into
the cache.

Generated at first use, not committed: generated code checks the protobuf runtime it runs on, so the stubs are
made by the grpcio-tools installed beside that runtime. Never edits the protos beyond dropping gogoproto
options.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

K8S_VERSION = os.environ.get("K8S_VERSION", "1.32.4")
CACHE = Path(os.environ.get("GPULEDGER_CACHE", Path.home() / ".cache" / "gpuledger"))
# the staging module k8s.io/kubelet is tagged v0.MINOR.PATCH for kubernetes v1.MINOR.PATCH
KUBELET_MODULE = f"k8s.io/kubelet@v0.{K8S_VERSION.split('.', 1)[1]}"
PACKAGE = "gpuledger_kubelet_api"  # a top-level name of our own, so the generated modules import each other
PROTOS = {
    "deviceplugin/v1beta1": "pkg/apis/deviceplugin/v1beta1/api.proto",
    "podresources/v1": "pkg/apis/podresources/v1/api.proto",
}

_GOGO = (
    re.compile(r'^import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n', re.M),
    re.compile(r"^option \(gogoproto\.\w+\)\s*=\s*\w+;\n", re.M),
    re.compile(r"\s*\[\(gogoproto\.\w+\)\s*=\s*\"[^\"]*\"\]"),
)


class KubeletApiError(RuntimeError):
    pass


def strip_gogo(proto: str) -> str:
    """Drop gogoproto's Go-only options (import, file options, field options): the wire format is
    unchanged."""
    for pattern in _GOGO:
        proto = pattern.sub("", proto)
    if "gogoproto" in proto:
        raise KubeletApiError("a gogoproto option this generator does not know is left in the .proto")
    return proto


def kubelet_module_dir() -> Path:
    """`go mod download -json k8s.io/kubelet@v0.X.Y`: the module's folder in Go's module cache."""
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", GOSUMDB=os.environ.get("GOSUMDB", "off"))
    with tempfile.TemporaryDirectory() as empty:  # outside any module, so no go.mod is read or changed
        proc = subprocess.run(
            ["go", "mod", "download", "-json", KUBELET_MODULE],
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
            f"go mod download {KUBELET_MODULE} exited {proc.returncode}: {proc.stderr.strip()}"
        ) from err
    if info.get("Error") or not info.get("Dir"):
        raise KubeletApiError(f"go mod download {KUBELET_MODULE}: {info.get('Error')}")
    return Path(info["Dir"])


def _tools_version() -> str:
    from importlib.metadata import version

    return version("grpcio-tools")


def generated_dir() -> Path:
    return CACHE / f"kubelet-api-{KUBELET_MODULE.split('@')[1]}-grpcio-tools-{_tools_version()}"


def generate(out: Path | None = None) -> Path:
    """The stubs under `out` (the cache by default), made once; concurrent callers race to one rename."""
    out = out or generated_dir()
    if (out / PACKAGE / "done").exists():
        return out
    import grpc_tools  # type: ignore[import-untyped]  # grpcio-tools ships no type hints

    module = kubelet_module_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        sources = []
        for folder, proto in PROTOS.items():
            target = work / PACKAGE / folder / "api.proto"
            target.parent.mkdir(parents=True)
            target.write_text(strip_gogo((module / proto).read_text()))
            sources.append(str(target.relative_to(work)))
        includes = Path(grpc_tools.__file__).parent / "_proto"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{work}",
                f"-I{includes}",
                f"--python_out={work}",
                f"--grpc_python_out={work}",
                *sources,
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise KubeletApiError(f"grpc_tools.protoc exited {proc.returncode}: {proc.stderr.strip()}")
        (work / PACKAGE / "done").write_text(f"{KUBELET_MODULE}\n")
        try:
            work.rename(out)
        except OSError:  # another process finished first: its stubs are the same
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def load() -> SimpleNamespace:
    """deviceplugin / deviceplugin_grpc / podresources / podresources_grpc modules, generating them if
    needed."""
    root = str(generate())
    if root not in sys.path:
        sys.path.append(root)

    def module(folder: str, suffix: str):
        return importlib.import_module(f"{PACKAGE}.{folder.replace('/', '.')}.api_{suffix}")

    return SimpleNamespace(
        deviceplugin=module("deviceplugin/v1beta1", "pb2"),
        deviceplugin_grpc=module("deviceplugin/v1beta1", "pb2_grpc"),
        podresources=module("podresources/v1", "pb2"),
        podresources_grpc=module("podresources/v1", "pb2_grpc"),
    )
