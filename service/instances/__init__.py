"""Consumer instances: the registry (tenants → groups → instances, lifecycle, idle expiry) and the process memory
budget."""
