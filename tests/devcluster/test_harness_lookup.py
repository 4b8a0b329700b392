"""`gpuledger demo` finds the development harness however it is started from a checkout, and says what to
run when it is not in one. Each case is a process of its own, started from a directory that is not the
checkout, with no PYTHONPATH: as a newcomer starts it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_console_script_finds_the_harness_from_any_directory(tmp_path):
    script = Path(sys.executable).parent / "gpuledger"
    assert script.is_file(), f"{script}: the editable install's console script (`make venv`)"
    proc = run([str(script), "demo", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage: gpuledger demo" in proc.stdout and "--keep-running" in proc.stdout


def test_python_dash_m_finds_the_harness_from_any_directory(tmp_path):
    proc = run([sys.executable, "-m", "gpuledger", "demo", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage: gpuledger demo" in proc.stdout


def test_outside_a_checkout_it_says_what_to_run(tmp_path):
    """The package alone, as a wheel installs it: no devcluster/ beside it."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "gpuledger", site / "gpuledger", ignore=shutil.ignore_patterns("__pycache__"))
    proc = run([sys.executable, "-m", "gpuledger", "demo"], tmp_path, pythonpath=str(site))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "runs from a source checkout of gpuledger" in proc.stderr
    assert "clone the repository and run `make demo` in it" in proc.stderr
    assert "Traceback" not in proc.stderr
