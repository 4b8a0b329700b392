"""random: a pseudo-random node, a pure function of (seed, request id, node name).
It must never draw from a global random source: the same inputs always pick the same node.
"""

from __future__ import annotations

import zlib

from gpuledger.core.plugins.plugin import Strategy


class RandomChoice(Strategy):
    """A pseudo-random node, stable for a given (seed, request id)."""

    name = "random"

    def score(self, node, request, fit, ctx):
        return float(zlib.crc32(f"{ctx.seed}:{ctx.request_id}:{node.name}".encode()))
