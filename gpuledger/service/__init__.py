"""The batched ledger service, its settings, and where its objects come from: no Ray, HTTP or Kubernetes."""
