"""The strategy plug-in interface and its registry.

Owns what a strategy sees (`ScoreContext`), what it returns (`Fit`), the base class and the device checks
every strategy shares (`plugin`), and the names -> factories registry (`registry`) the placing, the line
and the request parser resolve strategy names through. The strategies themselves live in
gpuledger.strategies and register here; nothing here knows one by name.

May import: `gpuledger.core.model` and the standard library; `gpuledger.core.nodes` only for the types the
interface names (under TYPE_CHECKING).
"""
