"""The settings' strategy check knows the built-in strategies in a process that imports nothing else of
gpuledger (the operator's `gpuledger strategy NAME` runs so)."""

from __future__ import annotations

import subprocess
import sys


def test_check_strategy_knows_the_built_ins_on_its_own():
    code = (
        "from gpuledger.service.settings import check_strategy, strategy_names\n"
        "print(check_strategy('best_fit'), len(strategy_names()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    name, count = out.split()
    assert name == "best_fit" and int(count) >= 12
