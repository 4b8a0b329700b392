"""The pod's request and what the cluster's objects say, read: Kubernetes dicts in, core types out.

Owns the readers of every annotation value (`annotation_values`) and spec field (`pod_spec`), the resource
quantity parser (`quantity`), the pod -> `Request` parser (`request`), the one Node and Pod parsing layer
(`objects`), the ResourceSlices of GPU DRA drivers (`resource_slices`), the node agent's device-holders
annotation (`device_truth`) and the signed codecs of the placement and waiting annotations
(`placement_codec`, `waiting_codec`). Pure and total: nothing here holds state, places a pod or reads a
clock.

May import: `gpuledger.core.model`, `gpuledger.core.slots_init`, `gpuledger.core.plugins` (the request parser
resolves strategy names through the registry), `gpuledger.core.nodes` (the types a ResourceSlice is read
into), `gpuledger.names` and the standard library; never the books,
the placing, the queues or the ledger.
"""
