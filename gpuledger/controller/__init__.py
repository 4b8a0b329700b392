"""The GPUWorkload/GPUNode controller: a priority queue in front of the ledger, Jobs the webhook places."""
