"""Scripts that measure or check the engine (run by hand or on a GPU machine, not as tests)."""
