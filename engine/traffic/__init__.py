"""Traffic sent to running replicas: the load generator, the prober, capacity calibration."""
