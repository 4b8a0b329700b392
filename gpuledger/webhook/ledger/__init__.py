"""The webhook's side of the ledger: the client, its channel, the batcher, placements admitted ahead."""
