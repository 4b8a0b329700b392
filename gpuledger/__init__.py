"""gpuledger: GPU placement for Kubernetes decided at admission time, from one global GPU ledger.

The pure ledger (`core`, `strategies`), the batched service in front of it (`service`), the adapters at the
I/O edges (`ray`, `sync`, `webhook`, `controller`, `node_agent`), the offline tools (`sim`, `certs`), the
operator CLI (`cli`, `views`, `client`) and the wire names they share (`names`). docs/architecture.md has
the map. The built-in strategies register with the core's registry when `gpuledger.strategies` is imported
(the service does).
"""
