"""FGD as the paper's artifact scores it (hkust-adsl/kubernetes-scheduler-simulator, `FGDScore`), for the
simulator's fidelity replays only: registered by `register_variants`, never a default, never the webhook's.

Three switches, each one difference between our `fgd` and the artifact's plug-in:

* `quantize`: the artifact's node score is `int64(sigmoid(-increase / 1000) * 100)`, an integer 0..100, so
  every increase in (0, ~40] milli scores 49, a small decrease scores 50 like no change, and so on;
* `random_ties`: kube-scheduler's `selectHost` takes a uniformly random node among those with the highest
  score (reservoir sampling on the seeded global generator); ours takes the lowest node name;
* `first_device`: for a share the artifact keeps the first device index with the highest score; ours keeps
  the smallest increase, then the fullest device, then the lowest index.

Everything else (the fragmentation measure, the target workload, whole-GPU choice) is `fgd`'s.
"""

from __future__ import annotations

import math
import random
import weakref

from allocator.core.model import DeviceShare
from allocator.core.plugin import Fit, device_ok
from allocator.strategies.fgd import FragmentationGradientDescent, _free_vector


def artifact_score(increase: float) -> int:
    """The artifact's integer node score for a fragmentation increase (milli-GPU); higher is better."""
    return int(100.0 / (1.0 + math.exp(increase / 1000.0)))


class ArtifactFGD(FragmentationGradientDescent):
    """`fgd` with any of the artifact's score quantisation, random tie-break and share device pick."""

    name = "fgd_artifact"

    def __init__(self, quantize: bool = True, random_ties: bool = True, first_device: bool = True) -> None:
        super().__init__()
        self.quantize, self.random_ties, self.first_device = quantize, random_ties, first_device
        self._rngs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _key(self, increase: float) -> float:
        """What the walk sorts by (lower first): the increase, or minus the artifact's integer score."""
        return float(-artifact_score(increase)) if self.quantize else increase

    def _compute(self, node, request, meter):
        if not (self.first_device and request.is_shared) or request.gpu_memory_mib:
            result = super()._compute(node, request, meter)
            return None if result is None else (self._key(result[0]), result[1])
        free = _free_vector(node)
        product = node.info.product or next((d.product for d in node.info.devices if d.product), "")
        before = meter.fragmentation(node.cpu_free, free, product)
        cpu_after, milli = node.cpu_free - request.cpu_milli, request.gpu_milli
        best = None  # (key, position): the first device index with the best key, as the artifact loops
        for p, free_milli in enumerate(free):
            if free_milli < milli or node.dev_owner[p] is not None:
                continue
            if node.dev_nshares[p] == 0 and node.whole_free <= 0:
                continue
            if not device_ok(node, p, request):
                continue
            trial = list(free)
            trial[p] = free_milli - milli
            key = self._key(round(meter.fragmentation(cpu_after, trial, product) - before, 6))
            if best is None or key < best[0]:
                best = (key, p)
        if best is None:
            return None
        return best[0], Fit(shares=(DeviceShare(device=node.dev_index[best[1]], milli=milli),))

    def candidates(self, request, ctx, leaves):
        walk = super().candidates(request, ctx, leaves)
        if not self.random_ties or walk is None:
            return walk
        return self._shuffled_ties(walk, request, ctx)

    def _shuffled_ties(self, walk, request, ctx):
        """The walk with each run of equal keys in a seeded random order: the first feasible node of the top
        run is uniform among that run's feasible nodes, as `selectHost` picks among equal top scores."""
        rng = self._rngs.get(ctx.index)
        if rng is None:
            rng = self._rngs[ctx.index] = random.Random(request.seed)
        index = ctx.index
        run: list = []
        current = None
        for node in walk:
            key = self._last_evaluation[4][0] if self._last_evaluation else None
            if run and key != current:
                yield from _drain(run, rng, self, request, ctx, index)
                run = []
            current = key
            run.append((node, self._last_evaluation))
        if run:
            yield from _drain(run, rng, self, request, ctx, index)


def _drain(run, rng, strategy, request, ctx, index):
    """Yield the run's nodes in random order (swap-pop), restoring each node's hint for the ledger."""
    while run:
        i = rng.randrange(len(run))
        run[i], run[-1] = run[-1], run[i]
        node, hint = run.pop()
        moved = index.touched_base + len(index.touched)
        strategy._last_evaluation = (node, request, ctx, moved, hint[4])
        yield node


VARIANTS = {
    # name: (quantize, random_ties, first_device)
    "fgd_artifact": (True, True, True),
    "fgd_quantized": (True, False, False),
    "fgd_quantized_random": (True, True, False),
    "fgd_random_ties": (False, True, False),
    "fgd_first_device": (False, False, True),
}


def register_variants() -> None:
    """Make the variants selectable by name (the simulator does this; the webhook never does)."""
    from allocator.core.registry import register

    for name, (quantize, random_ties, first_device) in VARIANTS.items():
        register(name, lambda n=name, q=quantize, r=random_ties, f=first_device: _named(n, q, r, f))


def _named(name: str, quantize: bool, random_ties: bool, first_device: bool) -> ArtifactFGD:
    strategy = ArtifactFGD(quantize, random_ties, first_device)
    strategy.name = name
    return strategy
