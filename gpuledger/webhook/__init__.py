"""gpuledger admission webhook: HTTP, TLS, AdmissionReview and JSON patches around the ledger."""
