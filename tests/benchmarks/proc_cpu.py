"""CPU time of other processes, from /proc: how the benchmarks tell the ledger actor's share of a run's CPU
from the webhook process's (which reads its own with `time.process_time` and `time.thread_time`)."""

from __future__ import annotations

import os


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def actor_pid(ancestor: int) -> int | None:
    """The ledger actor's worker process among `ancestor`'s descendants (its local Ray's raylet forks it)."""
    parents: dict[int, int] = {}
    actors = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::LedgerActor"):
                    actors.append(int(entry))
        except OSError:
            continue
    for pid in actors:
        up = pid
        while up in parents and up != ancestor:
            up = parents[up]
        if up == ancestor:
            return pid
    return None
