"""CPU time of other processes and of threads, from /proc: what the benchmarks split a run's CPU by (the
webhook's event loop against the rest of its process, the ledger actor beside it)."""

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
