"""Load generation with the field's workloads (`infersight loadgen`); capacity calibration
(`infersight calibrate`, engine/traffic/calibrate.py) drives it."""
