"""The layers hold: the import-linter contracts in pyproject.toml, a core that imports only the stdlib and
gpuledger.names (the wire names, which import nothing of gpuledger), no product code in tests/."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("gpuledger", "devcluster")
NAMES = "gpuledger.names"  # the wire names: every layer may import it, the core too


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.exists(), f"lint-imports not found next to {sys.executable}; install the dev extras"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout


def _own(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_core_imports_only_the_standard_library_and_the_wire_names():
    for path in sorted((ROOT / "gpuledger" / "core").rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            assert _own(name, "gpuledger.core") or name == NAMES or top in sys.stdlib_module_names, (
                f"{path.relative_to(ROOT)} imports {name}: "
                f"gpuledger.core may import only the standard library, {NAMES} and itself"
            )


def test_the_wire_names_import_only_the_standard_library():
    path = ROOT / "gpuledger" / "names.py"
    for name in _imports(path):
        assert name.split(".")[0] in sys.stdlib_module_names, (
            f"{path.relative_to(ROOT)} imports {name}: every layer imports {NAMES}, so it imports no layer"
        )


def test_no_product_module_imports_tests():
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            bad = [n for n in _imports(path) if n == "tests" or n.startswith("tests.")]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}: product code must not depend on tests/"


def test_the_layers_contract_names_packages_that_exist():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    for layer in layers:
        for name in (part.strip() for part in layer.split("|")):
            base = ROOT / name.replace(".", "/")
            assert base.is_dir() or base.with_suffix(".py").exists(), (
                f"{name} is in the layers but does not exist"
            )
    assert layers[-1] == "gpuledger.core"
