"""Load generation with the field's workloads (`infersight loadgen`) and capacity calibration (`infersight calibrate`)."""
