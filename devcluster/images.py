"""Container images for the real node, built from Debian's static busybox: nothing can be pulled on these
machines.

Writes docker-archive tarballs (manifest.json + config + one layer) with plain Python, no docker daemon, and
imports them into containerd's k8s.io namespace under the names the kubelet asks for. Never touches a
registry.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path(os.environ.get("GPULEDGER_BUSYBOX", "/bin/busybox"))
# the kubelet's default pod infra image; containerd's sandbox_image is set to the same name
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# not `latest`, so a pod's default imagePullPolicy is IfNotPresent and the kubelet never tries to pull
TEST_IMAGE = "gpuledger.local/busybox:test"

_EPOCH = 0  # fixed mtimes: the same busybox gives the same image digests, run after run


def tar_entry(name: str, kind: bytes, mode: int, **extra) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, _EPOCH, 0, 0
    for key, value in extra.items():
        setattr(info, key, value)
    return info


def rootfs_layer(busybox: Path = BUSYBOX) -> bytes:
    """An uncompressed layer: /bin/busybox, a symlink per applet (`busybox --list-full`), the usual dirs."""
    applets = subprocess.run(
        [str(busybox), "--list-full"], capture_output=True, text=True, check=True
    ).stdout.split()
    dirs = {"bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "etc", "proc", "sys", "root", "var", "tmp"}
    dirs |= {str(Path(a).parent) for a in applets if "/" in a}
    files = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            tar.addfile(tar_entry(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
        data = busybox.read_bytes()
        tar.addfile(tar_entry("bin/busybox", tarfile.REGTYPE, 0o755, size=len(data)), io.BytesIO(data))
        for name, content in sorted(files.items()):
            tar.addfile(tar_entry(name, tarfile.REGTYPE, 0o644, size=len(content)), io.BytesIO(content))
        for applet in sorted(set(applets) - {"bin/busybox"}):
            tar.addfile(tar_entry(applet, tarfile.SYMTYPE, 0o777, linkname="/bin/busybox"))
    return buf.getvalue()


def docker_archive(repo_tag: str, layer: bytes, config: dict) -> bytes:
    """A `docker save`-format tarball of one single-layer linux/amd64 image, as `ctr images import` reads
    it."""
    layer_digest = hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "devcluster/images.py"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [repo_tag], "Layers": [f"{layer_digest}/layer.tar"]}]
    members = {
        f"{layer_digest}/layer.tar": layer,
        config_name: config_bytes,
        "manifest.json": json.dumps(manifest).encode(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tar_entry(layer_digest, tarfile.DIRTYPE, 0o755))
        for name, content in members.items():
            tar.addfile(tar_entry(name, tarfile.REGTYPE, 0o644, size=len(content)), io.BytesIO(content))
    return buf.getvalue()


def image_configs() -> dict[str, dict]:
    """name -> OCI image config. The pause container only has to outlive the pod; containerd SIGKILLs it."""
    path = {"Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
    return {
        PAUSE_IMAGE: {**path, "Entrypoint": ["/bin/sleep", "2147483647"]},
        TEST_IMAGE: {**path, "Cmd": ["/bin/sh"]},
    }


def build_images(out_dir: Path, busybox: Path = BUSYBOX) -> list[Path]:
    """The image tarballs, rebuilt only when the busybox binary changes (its digest names the cache
    folder)."""
    digest = hashlib.sha256(busybox.read_bytes()).hexdigest()[:16]
    folder = Path(out_dir) / f"busybox-{digest}"
    configs = image_configs()
    paths = [folder / f"{name.replace('/', '_').replace(':', '_')}.tar" for name in configs]
    if all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    layer = rootfs_layer(busybox)
    for path, (name, config) in zip(paths, configs.items(), strict=True):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(docker_archive(name, layer, config))
        tmp.replace(path)
    return paths


def import_images(containerd_socket: Path, tarballs: list[Path], timeout: float = 120) -> None:
    """`ctr -n k8s.io images import` of docker or OCI archives: the CRI plugin serves what the k8s.io
    namespace holds, unpacked. `ctr` is the cached containerd 2 build's (devcluster/build_runtime.sh), else
    the one on PATH."""
    from devcluster.containerd import runtime_binary  # here: devcluster.containerd imports this module

    ctr = runtime_binary("ctr") or "ctr"
    for tarball in tarballs:
        subprocess.run(
            [ctr, "--address", str(containerd_socket), "-n", "k8s.io", "images", "import", str(tarball)],
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
        )
