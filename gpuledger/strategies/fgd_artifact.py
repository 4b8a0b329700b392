"""FGD as the paper's artifact scores it (hkust-adsl/kubernetes-scheduler-simulator, `FGDScore`), for the
simulator's fidelity replays only: registered by `register_variants`, never a default, never the webhook's.

Three switches, each one difference between our `fgd` and the artifact's plug-in:

* `quantize`: the artifact's node score is `int64(sigmoid(-increase / 1000) * 100)`, an integer 0..100, so
  every increase in (0, ~40] milli scores 49, a small decrease scores 50 like no change, and so on;
* `ties`: which of the nodes with the best score wins. The artifact builds on a fork of kube-scheduler
  1.20.5 (`github.com/mental2008/kubernetes v1.20.5-minor`) whose `selectHost` keeps "the smallest
  lexicographical order if the score remains the same" (stock 1.20 picks at random among them), and it
  renames every node `%04d-<name>` with the prefix from a permutation drawn with the run's seed
  (`syncClusterResourceList`): ties go by a seeded random node order that stays fixed for the whole run
  (`"order"`). Ours go by node name (`"name"`); `"random"` is stock kube-scheduler's reservoir sampling, a
  fresh uniform draw among the tied nodes for every pod;
* `first_device`: for a share the artifact keeps the first device index with the highest score; ours keeps
  the smallest increase, then the fullest device, then the lowest index.

Everything else (the fragmentation measure, the target workload, whole-GPU choice) is `fgd`'s.
"""

from __future__ import annotations

import math
import random
import weakref
from functools import partial

from gpuledger.core.model import DeviceShare
from gpuledger.core.plugins.plugin import Fit, device_ok
from gpuledger.strategies.fgd import FragmentationGradientDescent, _free_vector


def artifact_score(increase: float) -> int:
    """The artifact's integer node score for a fragmentation increase (milli-GPU); higher is better."""
    return int(100.0 / (1.0 + math.exp(increase / 1000.0)))


class ArtifactFGD(FragmentationGradientDescent):
    """`fgd` with any of the artifact's score quantisation, tie-break and share device pick."""

    name = "fgd_artifact"

    def __init__(self, quantize: bool = True, ties: str = "order", first_device: bool = True) -> None:
        super().__init__()
        if ties not in ("name", "order", "random"):
            raise ValueError(f"ties={ties!r} is not accepted: expected name, order or random")
        self.quantize, self.ties, self.first_device = quantize, ties, first_device
        self._rngs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._ranks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

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
        if self.ties == "name" or walk is None:
            return walk
        return self._reordered_ties(walk, request, ctx)

    def _rank(self, ctx, request):
        """node name -> its place in the run's fixed random node order (the artifact's `%04d-` prefix)."""
        ranks = self._ranks.get(ctx.index)
        if ranks is None:
            names = sorted(ctx.index.nodes)
            order = list(range(len(names)))
            random.Random(request.seed).shuffle(order)
            ranks = self._ranks[ctx.index] = dict(zip(names, order, strict=True))
        return ranks

    def _reordered_ties(self, walk, request, ctx):
        """The walk with each run of equal keys reordered: by the fixed node order, or freshly at random."""
        index = ctx.index
        if self.ties == "order":
            ranks, rng = self._rank(ctx, request), None
        else:
            ranks, rng = None, self._rngs.get(index)
            if rng is None:
                rng = self._rngs[index] = random.Random(request.seed)
        run: list = []
        current = None
        for node in walk:
            key = self._last_evaluation[4][0] if self._last_evaluation else None
            if run and key != current:
                yield from self._drain(run, ranks, rng, request, ctx)
                run = []
            current = key
            run.append((node, self._last_evaluation))
        if run:
            yield from self._drain(run, ranks, rng, request, ctx)

    def _drain(self, run, ranks, rng, request, ctx):
        """Yield a run's nodes in tie order, restoring each node's hint for the ledger's asks."""
        index = ctx.index
        if ranks is not None:
            run.sort(key=lambda item: ranks.get(item[0].name, len(ranks)))
            run.reverse()  # popped from the end: lowest rank first
        while run:
            if rng is not None:
                i = rng.randrange(len(run))
                run[i], run[-1] = run[-1], run[i]
            node, hint = run.pop()
            moved = index.touched_base + len(index.touched)
            self._last_evaluation = (node, request, ctx, moved, hint[4], hint[5])
            yield node


VARIANTS: dict[str, tuple[bool, str, bool]] = {
    # name: (quantize, ties, first_device); `fgd` itself is (False, "name", False)
    "fgd_artifact": (True, "order", True),  # all three as the artifact runs FGD
    "fgd_quantized": (True, "name", False),
    "fgd_quantized_order": (True, "order", False),
    "fgd_node_order": (False, "order", False),
    "fgd_first_device": (False, "name", True),
    "fgd_random_ties": (False, "random", False),  # stock kube-scheduler's selectHost, for comparison
    "fgd_quantized_random": (True, "random", False),
}


def register_variants() -> None:
    """Make the variants selectable by name (the simulator does this; the webhook never does)."""
    from gpuledger.core.plugins.registry import register

    for name in VARIANTS:
        register(name, partial(_named, name))


def _named(name: str) -> ArtifactFGD:
    quantize, ties, first_device = VARIANTS[name]
    strategy = ArtifactFGD(quantize, ties, first_device)
    strategy.name = name
    return strategy
