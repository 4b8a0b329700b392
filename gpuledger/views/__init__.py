"""What the operator commands show, computed from API objects: inventory, health, workloads, placements."""
