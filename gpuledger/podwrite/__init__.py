"""The pod-write layer: what gpuledger writes onto a pod, stated once for both of its writers.

The admission webhook (gpuledger.webhook.admission.patch) writes a placement or a waiting ticket onto a pod
being created; the placement adapter (gpuledger.sync.placer) writes a placement onto a pod that waited gated.
Both write the same things (the node, the tolerations, the device variables) through this layer: plain dicts
in, RFC 6902 JSON patch operations out, and nothing here knows a Kubernetes client, Ray, HTTP or YAML.
"""
