"""The Ray adapter: the named ledger actor and its direct socket channel."""
