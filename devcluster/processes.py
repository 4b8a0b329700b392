"""Stopping a child process of the harness: SIGTERM, a grace period, then SIGKILL."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen | None, grace_s: float = 10.0) -> int | None:
    """Terminate `proc` if it runs, kill it if it outlives `grace_s`; its exit code (None for no proc)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode
