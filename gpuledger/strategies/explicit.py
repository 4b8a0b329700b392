"""explicit: the `gpu-scheduling-map` strategy; a pinned request goes exactly where its map says (the ledger
checks and takes the pinned devices), a request without one is placed by best fit. It adds no rule of its own.
"""

from __future__ import annotations

from gpuledger.strategies.best_fit import BestFit


class Explicit(BestFit):
    """The `gpu-scheduling-map`: a request with `pinned` goes exactly there; without one, best fit."""

    name = "explicit"
