"""The Kubernetes adapter that keeps the ledger true to the cluster: watches, events, expiry, conflicts."""
