"""The product image built here without a registry or a docker daemon, from the Dockerfile's own recipe.

No container registry is reachable from these machines, so `python:<version>-slim-<suite>` cannot be
pulled. This builds the same image from what is reachable, Debian's archive and PyPI: mmdebstrap makes a
minimal Debian root filesystem (its python3 is the Python of the python image of the same suite), the build
stage's commands run in it (the virtualenv, `pip install`, compileall), then the runtime stage's (its user),
and the container config is the runtime stage's ENV, USER, EXPOSE, ENTRYPOINT and CMD. All of it is read
from the Dockerfile (devcluster/dockerfile.py), so the two cannot drift; the Dockerfile stays the recipe users
build with.

Two layers, each cached under $GPULEDGER_CACHE/images by a hash of what goes into it: the base (Debian, the
virtualenv with Ray and every dependency, the user) is rebuilt only when the package list, the Dockerfile's
ARGs or commands, or the wheel's dependencies change, which takes minutes; the top layer (the gpuledger wheel,
installed over the base on an overlay mount) is rebuilt whenever the code changes, in seconds. The result is
an OCI image archive that devcluster/images.py imports into a real node's containerd. Needs root (mmdebstrap's
root mode, chroot, the overlay mount).

    python -m devcluster.product_image      # builds (or finds) the archive and prints its path
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import fcntl
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from devcluster import images
from devcluster.binaries import CACHE, REPO
from devcluster.dockerfile import DOCKERFILE, Dockerfile, DockerfileError, copied_files

IMAGE_CACHE = CACHE / "images"
# what the python image sets before the Dockerfile's own ENV (its PATH also names /usr/local/bin first,
# where that image's Python lives; Debian's python3 lives in /usr/bin)
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# besides the runtime stage's `apt-get install`: what the python image itself brings (its Python, venv, and
# the CA certificates pip and Ray's clients verify TLS with)
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
MIRRORS = (
    "deb http://deb.debian.org/debian {suite} main",
    "deb http://deb.debian.org/debian {suite}-updates main",
    "deb http://deb.debian.org/debian-security {suite}-security main",
)
# the python image's naming: python:<major.minor>-slim-<Debian suite>
_PYTHON_BASE = re.compile(r"^python:(?P<python>\d+\.\d+)-slim-(?P<suite>[a-z]+)$")
# the CA bundle pip trusts on this machine, lent to the build (a TLS-inspecting egress may sign PyPI's
# certificate); it stays in the chroot's /tmp, which mmdebstrap empties before packing
HOST_CA_BUNDLE = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
# the host's pip settings that say where PyPI is; passed to the build's pip, nothing else of the host's env
PIP_REACH = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT")
PROXIES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
# bump when a build step changes in a way the commands hashed into the keys do not show
BUILD_FORMAT = 1


class ProductImageUnavailable(RuntimeError):
    """What this machine lacks to build the image, with the command that provides it."""


def missing_parts() -> list[str]:
    lacking = []
    if not shutil.which("mmdebstrap"):
        lacking.append("mmdebstrap (apt-get install -y mmdebstrap, or bash devcluster/runtime.sh)")
    if os.geteuid() != 0:
        lacking.append("root (mmdebstrap's root mode, chroot and an overlay mount)")
    return lacking


@dataclass(frozen=True)
class Recipe:
    """Everything the build takes from the Dockerfile."""

    image_name: str  # what `docker build -t` names it in the Dockerfile's header, as the manifests use it
    python_version: str  # major.minor, from the runtime stage's FROM
    suite: str  # Debian's, from the same FROM
    args: dict[str, str]  # the global ARGs
    venv: str  # the folder the build stage makes its virtualenv in (and the runtime stage copies)
    debian_packages: list[str]  # BASE_PACKAGES and the runtime stage's `apt-get install`
    build_commands: list[list[str]]  # the build stage's commands, in order
    runtime_commands: list[list[str]]  # the runtime stage's commands other than apt's
    build_env: dict[str, str]  # the build stage's ENV over BASE_ENV: what its RUN lines see
    config: dict  # the OCI container config the runtime stage leaves

    @property
    def pip_install_args(self) -> list[str]:
        """The build stage's `pip install` arguments (`.` is the project, the wheel)."""
        found = [cmd[2:] for cmd in self.build_commands if cmd[:2] == ["pip", "install"]]
        if len(found) != 1:
            raise DockerfileError(f"the build stage should run `pip install` once, not {len(found)} times")
        return found[0]


def read_recipe(path: Path = DOCKERFILE) -> Recipe:
    dockerfile = Dockerfile(path)
    final, build = dockerfile.final, dockerfile.stages[0]
    base = _PYTHON_BASE.match(final.base)
    if base is None or build.base != final.base:
        raise DockerfileError(
            f"{path.name}: both stages FROM python:<major.minor>-slim-<suite> (the same one), not "
            f"{build.base!r} and {final.base!r}: the harness builds that image from Debian's python3"
        )
    named = re.search(r"docker build -t (\S+) \.", path.read_text())
    if named is None:
        raise DockerfileError(f"{path.name}: its header names no `docker build -t <image> .` command")
    copies_venv = [c for c in dockerfile.copies(final) if c[2] == build.name]
    venvs = [c[3] for c in dockerfile.run_commands(build) if c[:3] == ["python", "-m", "venv"]]
    if len(venvs) != 1 or copies_venv != [([venvs[0]], venvs[0], build.name)]:
        raise DockerfileError(
            f"{path.name}: the build stage makes one virtualenv ({venvs}) and the runtime stage copies only "
            f"it ({copies_venv})"
        )
    apt = [c for c in dockerfile.run_commands(final) if c[:1] == ["apt-get"]]
    packages = [w for c in apt if c[1:2] == ["install"] for w in c[2:] if not w.startswith("-")]
    runtime = [
        c
        for c in dockerfile.run_commands(final)
        if c[:1] != ["apt-get"] and c != ["rm", "-rf", "/var/lib/apt/lists/*"]
    ]
    return Recipe(
        image_name=named.group(1),
        python_version=base.group("python"),
        suite=base.group("suite"),
        args=dict(dockerfile.global_args),
        venv=venvs[0],
        debian_packages=[*BASE_PACKAGES, *packages],
        build_commands=dockerfile.run_commands(build),
        runtime_commands=runtime,
        build_env=dockerfile.image_config(BASE_ENV, build).env,
        config=dockerfile.image_config(BASE_ENV, final).oci(),
    )


# ------------------------------------------------------------------ the wheel


def build_wheel(out_dir: Path, repo: Path = REPO, dockerfile_path: Path = DOCKERFILE) -> Path:
    """The wheel `pip install .` builds in the image: from exactly the files the build stage COPYs (after
    .dockerignore) into its WORKDIR, with this environment's setuptools."""
    dockerfile = Dockerfile(dockerfile_path)
    build = dockerfile.stages[0]
    workdir = PurePosixPath(dockerfile.workdir(build))
    with tempfile.TemporaryDirectory(prefix="gpuledger-context-") as tmp:
        for inside, source in copied_files(dockerfile, build, repo).items():
            relative = PurePosixPath(inside).relative_to(workdir)
            (Path(tmp) / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / source, Path(tmp) / relative)
        out_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(out_dir),
                tmp,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pip wheel of the image's build context failed:\n{proc.stdout}{proc.stderr}")
    (wheel,) = out_dir.glob("*.whl")
    return wheel


def wheel_digest(wheel: Path) -> str:
    """What the wheel holds (names and bytes), not the zip's timestamps: the same code, the same digest."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + archive.read(name) + b"\0")
    return digest.hexdigest()


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist, less those of its extras (which `pip install .` does not install)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(archive.read(metadata).decode())
    return [r for r in message.get_all("Requires-Dist") or [] if not re.search(r"\bextra\s*==", r)]


# ------------------------------------------------------------------ the build


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _chroot(env: dict[str, str], argv: list[str]) -> str:
    """A mmdebstrap hook's shell line (its $1 is the root): `argv` run inside with exactly `env`."""
    return 'chroot "$1" ' + shlex.join(["env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv])


def pypi_reach(ca_bundle_inside: str) -> dict[str, str]:
    """How the build's pip reaches PyPI from here: this machine's CA bundle and its pip index and proxy
    settings. Not part of the cache key: where the packages came from is not what they are."""
    return {
        "PIP_CERT": ca_bundle_inside,
        **{k: os.environ[k] for k in (*PIP_REACH, *PROXIES) if os.environ.get(k)},
    }


def base_steps(recipe: Recipe, requirements: list[str], reach: dict[str, str]) -> list[str]:
    """The hooks that make the base layer: the build stage's commands with its `pip install .` installing
    the project's dependencies (the project itself is the top layer), then the runtime stage's."""
    env = {**recipe.build_env, "HOME": "/root", **reach}
    steps = []
    for command in recipe.build_commands:
        if command[:3] == ["python", "-m", "venv"]:
            # Debian names its interpreter python3 (the python image links python to it); the version is the
            # Dockerfile's or the build stops here
            steps.append(_chroot(env, ["python3", *command[1:]]))
            want = tuple(int(part) for part in recipe.python_version.split("."))
            check = (
                f"import sys; sys.exit(sys.version_info[:2] != {want} and 'Debian {recipe.suite} has Python '"
                f" + sys.version + ', the Dockerfile wants {recipe.python_version}')"
            )
            steps.append(_chroot(env, ["python", "-c", check]))
        elif command[:2] == ["pip", "install"]:
            args = [a for a in recipe.pip_install_args if a != "."]
            steps.append(_chroot(env, ["pip", "install", *args, *requirements]))
        else:
            steps.append(_chroot(env, command))
    runtime_env = {"PATH": BASE_ENV["PATH"], "HOME": "/root"}
    steps += [_chroot(runtime_env, command) for command in recipe.runtime_commands]
    # the host's resolver and name were lent for the build; a container gets its own from the runtime
    steps.append('rm -f "$1/etc/resolv.conf" && : > "$1/etc/hostname"')
    return steps


def top_commands(recipe: Recipe, wheel_inside: str) -> list[list[str]]:
    """The project over the base: its wheel without dependencies (the base holds them), offline, and the
    build stage's other commands after `pip install` (compileall)."""
    found: list[list[str]] = []
    after_pip = False
    for command in recipe.build_commands:
        if command[:2] == ["pip", "install"]:
            found.append(["pip", "install", "--no-deps", "--no-index", wheel_inside])
            after_pip = True
        elif after_pip:
            found.append(command)
    return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build at a time per cache (a second waits and then finds the first one's result)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _run(argv: list[str], log: Path, what: str, timeout: float) -> None:
    with open(log, "ab") as out:
        proc = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}; the whole log: {log}):\n{tail}")


def _tar_layer(root: Path, out: Path, log: Path) -> None:
    """An uncompressed layer of `root`'s tree: names sorted, numeric owners (the image's, not the host's)."""
    partial = out.with_suffix(".partial")
    _run(
        [
            "tar",
            "--create",
            f"--file={partial}",
            f"--directory={root}",
            "--sort=name",
            "--numeric-owner",
            ".",
        ],
        log,
        f"tar of {root}",
        timeout=1800,
    )
    partial.replace(out)


def build_base(recipe: Recipe, requirements: list[str], cache: Path) -> Path:
    """The base layer's folder (rootfs/ and layer.tar), built with mmdebstrap unless the cache has it."""
    mirrors = [m.format(suite=recipe.suite) for m in MIRRORS]
    steps_key = base_steps(recipe, requirements, reach={})
    key = _key(BUILD_FORMAT, recipe.suite, mirrors, recipe.debian_packages, recipe.args, steps_key)
    folder = cache / f"gpuledger-base-{key}"
    if (folder / "layer.tar").exists():
        return folder
    lacking = missing_parts()
    if lacking:
        raise ProductImageUnavailable("building the product image needs: " + "; ".join(lacking))
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    log = partial / "build.log"
    ca_inside = f"/tmp/{HOST_CA_BUNDLE.name}"
    hooks = [f"copy-in {HOST_CA_BUNDLE} /tmp", *base_steps(recipe, requirements, pypi_reach(ca_inside))]
    print(f"building the image's base layer into {folder} (minutes; log: {log})", file=sys.stderr)
    _run(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            "--format=directory",
            f"--include={','.join(recipe.debian_packages)}",
            *[f"--customize-hook={hook}" for hook in hooks],
            recipe.suite,
            str(partial / "rootfs"),
            *mirrors,
        ],
        log,
        "mmdebstrap",
        timeout=3600,
    )
    entrypoint = recipe.config["Entrypoint"][0]
    if not (partial / "rootfs" / entrypoint.lstrip("/")).exists():
        raise RuntimeError(
            f"the ENTRYPOINT {entrypoint} is not in the base (Debian packages: {recipe.debian_packages})"
        )
    _tar_layer(partial / "rootfs", partial / "layer.tar", log)
    (partial / "layer.sha256").write_text(_sha256(partial / "layer.tar"))
    for older in cache.glob("gpuledger-base-*"):  # one base at a time: each is a few GB
        if older != partial:
            shutil.rmtree(older, ignore_errors=True)
    partial.replace(folder)
    return folder


def _whiteouts(upper: Path) -> list[str]:
    """Deletions an overlay's upper dir records (0/0 character devices, opaque dirs): the top layer never
    deletes from the base, and a layer would have to spell them as .wh. files."""
    found = []
    for folder, dirs, files in os.walk(upper):
        for name in dirs + files:
            path = Path(folder, name)
            info = path.lstat()
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                found.append(str(path.relative_to(upper)))
            elif stat.S_ISDIR(info.st_mode) and "trusted.overlay.opaque" in os.listxattr(
                path, follow_symlinks=False
            ):
                found.append(f"{path.relative_to(upper)}/ (opaque)")
    return found


def build_top(recipe: Recipe, base: Path, wheel: Path, cache: Path, key: str) -> Path:
    """The top layer's folder: the wheel installed over the base on an overlay mount; the upper dir is the
    layer."""
    folder = cache / f"gpuledger-top-{key}"
    if (folder / "layer.tar").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    upper, work, merged = partial / "upper", partial / "work", partial / "merged"
    for path in (upper, work, merged):
        path.mkdir(parents=True)
    log = partial / "build.log"
    options = f"lowerdir={base / 'rootfs'},upperdir={upper},workdir={work}"
    _run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
        log,
        "the overlay mount",
        timeout=60,
    )
    try:
        shutil.copy2(wheel, merged / "tmp" / wheel.name)
        env = {**recipe.build_env, "HOME": "/root"}
        for command in top_commands(recipe, f"/tmp/{wheel.name}"):
            inner = shlex.join(["env", "-i", *[f"{k}={v}" for k, v in env.items()], *command])
            _run(["chroot", str(merged), "sh", "-c", inner], log, shlex.join(command), timeout=900)
        (merged / "tmp" / wheel.name).unlink()
    finally:
        _run(["umount", str(merged)], log, "the overlay unmount", timeout=60)
    deleted = _whiteouts(upper)
    if deleted:
        raise RuntimeError(
            f"installing {wheel.name} deleted files of the base, which this layer cannot say: {deleted}"
        )
    _tar_layer(upper, partial / "layer.tar", log)
    (partial / "layer.sha256").write_text(_sha256(partial / "layer.tar"))
    for scratch in (upper, work, merged):
        shutil.rmtree(scratch)
    partial.replace(folder)
    return folder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------ the OCI archive


def _architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def containerd_name(image: str) -> str:
    """The name containerd stores `image` under (what the kubelet asks for): docker.io/ and library/ added."""
    first = image.split("/", 1)[0]
    if "/" not in image or not ("." in first or ":" in first or first == "localhost"):
        image = f"docker.io/{image if '/' in image else 'library/' + image}"
    return image


def write_oci_archive(out: Path, image: str, layers: list[Path], container_config: dict) -> None:
    """An OCI image layout as one tar (oci-layout, index.json, blobs/sha256/...), layers streamed from disk:
    `ctr images import` reads it, as do `docker load` and `podman load`."""
    diff_ids = [(layer.with_name("layer.sha256")).read_text().strip() for layer in layers]
    created = "1970-01-01T00:00:00Z"
    config = json.dumps(
        {
            "architecture": _architecture(),
            "os": "linux",
            "created": created,
            "config": container_config,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
            "history": [
                {"created": created, "created_by": f"devcluster/product_image.py: {n}"}
                for n in ("base", "top")
            ],
        },
        sort_keys=True,
    ).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": f"sha256:{config_digest}",
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{d}",
                    "size": layer.stat().st_size,
                }
                for d, layer in zip(diff_ids, layers, strict=True)
            ],
        },
        sort_keys=True,
    ).encode()
    manifest_digest = hashlib.sha256(manifest).hexdigest()
    full_name = containerd_name(image)
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": f"sha256:{manifest_digest}",
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": full_name,
                        "org.opencontainers.image.ref.name": full_name.rpartition(":")[2],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    small = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        f"blobs/sha256/{config_digest}": config,
        f"blobs/sha256/{manifest_digest}": manifest,
        "index.json": index,
    }
    partial = out.with_suffix(".partial")
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("blobs", "blobs/sha256"):
            tar.addfile(images.tar_entry(folder, tarfile.DIRTYPE, 0o755))
        for digest, layer in zip(diff_ids, layers, strict=True):
            info = images.tar_entry(
                f"blobs/sha256/{digest}", tarfile.REGTYPE, 0o644, size=layer.stat().st_size
            )
            with open(layer, "rb") as handle:
                tar.addfile(info, handle)
        for name, content in small.items():
            info = images.tar_entry(name, tarfile.REGTYPE, 0o644, size=len(content))
            tar.addfile(info, io.BytesIO(content))
    partial.replace(out)


def build(cache: Path = IMAGE_CACHE, repo: Path = REPO, dockerfile_path: Path = DOCKERFILE) -> Path:
    """The product image as an OCI archive in `cache`, built only where what goes into it changed."""
    recipe = read_recipe(dockerfile_path)
    with tempfile.TemporaryDirectory(prefix="gpuledger-wheel-") as tmp:
        wheel = build_wheel(Path(tmp), repo, dockerfile_path)
        with _locked(cache / "gpuledger.lock"):
            base = build_base(recipe, wheel_requirements(wheel), cache)
            top_key = _key(BUILD_FORMAT, base.name, wheel_digest(wheel), top_commands(recipe, wheel.name))
            archive = cache / f"gpuledger-{_key(top_key, recipe.image_name, recipe.config)}.oci.tar"
            if archive.exists():
                return archive
            top = build_top(recipe, base, wheel, cache, top_key)
            write_oci_archive(
                archive, recipe.image_name, [base / "layer.tar", top / "layer.tar"], recipe.config
            )
            for older in [*cache.glob("gpuledger-top-*"), *cache.glob("gpuledger-*.oci.tar")]:
                if older not in (top, archive):  # each code change makes a new one; only the newest is kept
                    shutil.rmtree(older) if older.is_dir() else older.unlink()
            return archive


def import_into(containerd_socket: Path, archive: Path) -> str:
    """The archive imported into a real node's containerd; the name the kubelet finds it under."""
    images.import_images(containerd_socket, [archive], timeout=900)
    return read_recipe().image_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devcluster.product_image", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--cache", type=Path, default=IMAGE_CACHE, help=f"where the layers are kept ({IMAGE_CACHE})"
    )
    args = parser.parse_args(argv)
    try:
        print(build(args.cache))
    except (ProductImageUnavailable, DockerfileError) as exc:
        print(f"python -m devcluster.product_image: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
