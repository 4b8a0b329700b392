"""The allocator core stays pure: the import-linter contract in pyproject.toml must hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_linter_contract_is_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.exists(), f"lint-imports not found next to {sys.executable}; install the dev extras"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and " 0 broken" in result.stdout


def test_contract_lists_the_core_modules_that_exist():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    core = next(c for c in contracts if c["type"] == "forbidden" and "ray" in c["forbidden_modules"])
    for module in ("model", "kube", "ledger", "strategies", "topology", "inventory"):
        assert f"allocator.{module}" in core["source_modules"]
    for name in core["source_modules"]:
        assert (ROOT / (name.replace(".", "/") + ".py")).exists(), f"{name} is listed but does not exist"
    for forbidden in ("ray", "aiohttp", "kubernetes"):
        assert forbidden in core["forbidden_modules"]
