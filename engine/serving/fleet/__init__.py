"""A local fleet: the sidecar and N replicas as processes (`infersight fleet up|status|down`)."""
