"""Deciding where a request goes, read-only over the books.

Owns the per-node filters (`filters`), candidate selection (`selection`), what `reserve` would answer and
`explain`'s table (`decisions`), denials and near misses (`diagnosis`, counted by `node_classes`), gangs
over the topology (`gangs`, bounded per leaf by `leaf_caps`), and whether a request could ever fit the
cluster (`ever_fits`). Deciding never holds, releases or expires anything but a gang's commit through the
books.

May import: `gpuledger.core.books`, `gpuledger.core.pods`, `gpuledger.core.plugins`, `gpuledger.core.nodes`,
the top-level `model`, `slots_init` and `steps`, `gpuledger.names` and the standard library; never the
queues, the passes or the ledger.
"""
