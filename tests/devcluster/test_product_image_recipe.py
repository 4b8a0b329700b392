"""The harness's image builder and the Dockerfile cannot drift: what the builder runs and sets is compared
with the Dockerfile read line by line here, independently of devcluster/dockerfile.py's parser.

Building and running the image is tests/e2e/test_product_image.py (root, a real node).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from devcluster.binaries import REPO
from devcluster.dockerfile import Dockerfile, DockerfileError, ignore_rules, ignored
from devcluster.product_image import BASE_ENV, BASE_PACKAGES, base_steps, read_recipe, top_commands


def dockerfile_lines() -> list[tuple[str, str]]:
    """(instruction, argument) per line, continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.partition(" ")[0], line.partition(" ")[2].strip())
        for line in lines
        if line and not line.startswith("#")
    ]


def runtime_stage() -> list[tuple[str, str]]:
    lines = dockerfile_lines()
    last_from = max(i for i, (ins, _) in enumerate(lines) if ins == "FROM")
    return lines[last_from:]


def arg(name: str) -> str:
    (value,) = [
        a.split("=", 1)[1] for ins, a in dockerfile_lines() if ins == "ARG" and a.startswith(f"{name}=")
    ]
    return value


def test_same_python_and_debian_suite_as_the_python_image():
    recipe = read_recipe()
    assert recipe.python_version == arg("PYTHON_VERSION")
    (base,) = {a.split()[0] for ins, a in dockerfile_lines() if ins == "FROM"}
    assert base == "python:${PYTHON_VERSION}-slim-" + recipe.suite
    assert {"python3", "python3-venv"} <= set(recipe.debian_packages)


def test_same_pip_install_with_the_dockerfiles_ray():
    recipe = read_recipe()
    ray = f"ray[default]=={arg('RAY_VERSION')}"
    steps = base_steps(recipe, ["aiohttp>=3.9"], reach={})
    (pip,) = [shlex.split(s) for s in steps if " pip install " in s]
    assert pip[pip.index("install") + 1 :] == [ray, "aiohttp>=3.9"]  # the Dockerfile's, then the wheel's
    (install_project,) = [c for c in top_commands(recipe, "/tmp/p.whl") if c[:2] == ["pip", "install"]]
    assert install_project[-1] == "/tmp/p.whl" and "--no-deps" in install_project


def test_same_runtime_packages():
    (run,) = [a for ins, a in runtime_stage() if ins == "RUN" and "apt-get install" in a]
    wanted = [w for w in run.split("apt-get install", 1)[1].split("&&")[0].split() if not w.startswith("-")]
    assert read_recipe().debian_packages == [*BASE_PACKAGES, *wanted]


def test_same_user_home_env_entrypoint_and_cmd():
    recipe = read_recipe()
    stage = runtime_stage()
    (user,) = [a for ins, a in stage if ins == "USER"]
    uid, gid = user.split(":")
    assert recipe.config["User"] == user
    (useradd,) = [c for c in recipe.runtime_commands if c[0] == "useradd"]
    options = {option: useradd[useradd.index(option) + 1] for option in ("--uid", "--gid", "--home-dir")}
    assert (options["--uid"], options["--gid"]) == (uid, gid)
    assert ["groupadd", "--gid", gid, "gpuledger"] in recipe.runtime_commands
    env = dict(e.split("=", 1) for e in recipe.config["Env"])
    for ins, text in stage:
        if ins == "ENV":
            for key, value in (pair.split("=", 1) for pair in shlex.split(text)):
                assert env[key] == value.replace("$PATH", BASE_ENV["PATH"]), key
    assert env["HOME"] == options["--home-dir"]
    assert env["PATH"].startswith(f"{recipe.venv}/bin:")
    (entrypoint,) = [json.loads(a) for ins, a in stage if ins == "ENTRYPOINT"]
    (cmd,) = [json.loads(a) for ins, a in stage if ins == "CMD"]
    assert (recipe.config["Entrypoint"], recipe.config["Cmd"]) == (entrypoint, cmd)
    (expose,) = [a for ins, a in stage if ins == "EXPOSE"]
    assert recipe.config["ExposedPorts"] == {f"{expose}/tcp": {}}


def test_the_image_name_is_the_one_the_dockerfile_documents():
    assert f"docker build -t {read_recipe().image_name} ." in (REPO / "Dockerfile").read_text()


def test_an_instruction_the_builder_does_not_read_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text('FROM python:3.11-slim-bookworm\nLABEL a="b"\n')
    with pytest.raises(DockerfileError, match=r"Dockerfile line 2: LABEL is not read here"):
        Dockerfile(path)


@pytest.mark.parametrize(
    ("lines", "path", "excluded"),
    [
        (["*", "!pkg/"], "pkg/sub/mod.py", False),
        (["*", "!pkg/"], "tests/test_x.py", True),
        (["*", "!pkg/", "**/__pycache__"], "pkg/sub/__pycache__/mod.cpython-311.pyc", True),
        (["*", "!pkg/", "**/*.pyc"], "pkg/mod.pyc", True),
        (["docs", "!docs/keep.md"], "docs/keep.md", False),
        (["docs/*.md"], "docs/sub/deep.md", False),  # `*` stays within one directory
        (["docs/**/*.md"], "docs/sub/deep.md", True),
        (["!pkg/", "*"], "pkg/mod.py", True),  # the last matching line wins
    ],
)
def test_dockerignore_rules_as_docker_reads_them(tmp_path, lines, path, excluded):
    (tmp_path / ".dockerignore").write_text("\n".join(["# a comment", *lines]) + "\n")
    assert ignored(path, ignore_rules(tmp_path / ".dockerignore")) is excluded
