"""The webhook's own Kubernetes API access: kept-alive connections, owner reads, Events."""
