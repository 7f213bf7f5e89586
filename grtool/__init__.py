"""grtool: data and indexes for chain-of-thought generative retrieval."""

import os

__version__ = "0.1.0"

# Idle OpenMP threads sleep instead of spinning. With the runtime's default (spin), torch's CPU threads that
# share cores with any other busy process wait on each other: measured here, 2 threads generated 5-15x slower
# than 1 under load, and no slower than 1 once they sleep. Read when torch loads OpenMP, so set before any
# import of torch; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
