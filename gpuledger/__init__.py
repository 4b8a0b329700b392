"""gpuledger's operator side: the `gpuledger status|nodes|workloads|...` commands and the Python helper.

Reads the cluster through the Kubernetes API only (never a ledger internal); the webhook stays the only
writer of placements, so everything here creates objects that go through admission like any other.
"""
