"""What the image holds, found without building it: the Dockerfile's build context (.dockerignore) and COPY
lines give the files `pip install .` runs on, the wheel built from exactly those files is what the virtualenv
gets, and every module a `gpuledger` subcommand imports, followed transitively, must be in it.

devcluster/dockerfile.py reads the Dockerfile and the context as docker does; devcluster/product_image.py
builds the wheel from them (and, with root, the whole image: tests/e2e/test_product_image.py).
"""

from __future__ import annotations

import ast
import functools
import shutil
import zipfile
from collections import deque
from pathlib import Path

import pytest

from devcluster import product_image
from devcluster.binaries import REPO
from gpuledger.cli.main import SUBCOMMANDS

FIRST_PARTY = ("gpuledger", "devcluster")
# subcommands that drive the development harness of a source checkout (devcluster/), never in the image;
# `gpuledger demo` in the image says so and names `make demo`
SOURCE_CHECKOUT_ONLY = {"demo"}
ENTRY_POINT = "gpuledger.cli.main"  # the console script: it runs before any subcommand's module


def module_file(repo: Path, name: str) -> Path | None:
    base = repo.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST):
    """Every node but the bodies of `if TYPE_CHECKING:` (imported by type checkers only, never run)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


@functools.cache
def first_party_imports(repo: Path, name: str, path: Path) -> frozenset[str]:
    """The first-party modules `name` imports at run time, at any depth of its code (a function's import runs
    when the function does), with the packages above each (importing a.b.c runs a and a.b)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _run_time_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # `from package import module` imports the module; `from module import name` only reads it
            found.update(
                f"{base}.{alias.name}" for alias in node.names if module_file(repo, f"{base}.{alias.name}")
            )
    first_party = {m for m in found if m.split(".")[0] in FIRST_PARTY}
    return frozenset(".".join(m.split(".")[: n + 1]) for m in first_party for n in range(m.count(".") + 1))


def import_chains(repo: Path, root: str) -> dict[str, list[str]]:
    """Every first-party module `root` reaches, each with the chain of imports that reaches it."""
    chains = {root: [root]}
    queue = deque([root])
    while queue:
        name = queue.popleft()
        path = module_file(repo, name)
        if path is None:
            continue  # not in the source tree: it will not be in the image either (the caller reports it)
        for imported in sorted(first_party_imports(repo, name, path)):
            if imported not in chains:
                chains[imported] = [*chains[name], imported]
                queue.append(imported)
    return chains


def wheel_modules(wheel: Path) -> set[str]:
    """The importable modules and packages the wheel installs."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".py") and ".dist-info/" not in n]
    modules = {n[: -len(".py")].replace("/", ".").removesuffix(".__init__") for n in names}
    return modules


def missing_from_image(repo: Path, wheel: Path) -> list[str]:
    """One line per subcommand and module it would import that the image lacks, with the chain of imports
    that reaches it; a module reached only through one already named is left out (its package is named)."""
    in_image = wheel_modules(wheel)
    problems = []
    for command, (module, _) in SUBCOMMANDS.items():
        if command in SOURCE_CHECKOUT_ONLY:
            continue
        for root in (ENTRY_POINT, module):
            for name, chain in import_chains(repo, root).items():
                if name in in_image or any(step not in in_image for step in chain[:-1]):
                    continue
                where = (
                    "not in the source tree either" if module_file(repo, name) is None else "not in the image"
                )
                problems.append(f"gpuledger {command}: imports {name} ({' -> '.join(chain)}): {where}")
    return sorted(set(problems))


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` builds in the image's build stage, from the files docker would copy."""
    return product_image.build_wheel(tmp_path_factory.mktemp("image-wheel"))


def test_the_wheel_holds_one_top_level_package(image_wheel):
    with zipfile.ZipFile(image_wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        declared = archive.read(top_level).decode().split()
    installed = {top for top in {n.split("/")[0] for n in names} if not top.endswith(".dist-info")}
    assert installed == {"gpuledger"}, f"the wheel installs top-level {sorted(installed)}, not only gpuledger"
    assert declared == ["gpuledger"]
    # the node agent generates its gRPC stubs from these at first use: package data, not code
    assert {n for n in names if n.endswith(".proto")} == {
        f"gpuledger/node_agent/protos/{p}/api.proto" for p in ("deviceplugin/v1beta1", "podresources/v1")
    }


def test_only_the_harness_commands_need_a_source_checkout():
    outside = {command for command, (module, _) in SUBCOMMANDS.items() if not module.startswith("gpuledger.")}
    assert outside == SOURCE_CHECKOUT_ONLY


def test_every_module_a_subcommand_imports_is_in_the_image(image_wheel):
    problems = missing_from_image(REPO, image_wheel)
    assert not problems, "the image would lack modules its commands import:\n" + "\n".join(problems)


def test_a_folder_the_build_context_leaves_out_is_named_with_the_commands_it_breaks(tmp_path):
    """The check itself: the sources with .dockerignore also excluding gpuledger/views/."""
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "gpuledger", tmp_path / "gpuledger", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / ".dockerignore", "a") as ignore:
        ignore.write("gpuledger/views/\n")
    wheel = product_image.build_wheel(
        tmp_path / "wheel", repo=tmp_path, dockerfile_path=tmp_path / "Dockerfile"
    )
    problems = missing_from_image(tmp_path, wheel)
    assert problems
    assert all("gpuledger.views" in p and p.endswith("not in the image") for p in problems)
    assert any(p.startswith("gpuledger status: imports gpuledger.views") for p in problems)
    assert not any(p.startswith("gpuledger serve:") for p in problems)  # the webhook does not read the views
