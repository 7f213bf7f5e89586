"""grtool: data and indexes for chain-of-thought generative retrieval."""

import os

__version__ = "0.1.0"

# Idle OpenMP threads sleep instead of spinning. With the runtime's default (spin), torch's CPU threads that
# share cores with any other busy process wait on each other: measured here, 2 threads generated 5-15x slower
# than 1 under load, and no slower than 1 once they sleep. Read when torch loads OpenMP, so set before any
# import of torch; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# polars allocates through its own jemalloc, which by default keeps freed pages for seconds and purges them only
# when it allocates again: a columnar pass (`index build` reading a triples stage) then held hundreds of MB it
# had freed through the native build that followed. A background thread gives them back promptly. Read when
# polars loads; an explicit _RJEM_MALLOC_CONF wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "background_thread:true,dirty_decay_ms:500,muzzy_decay_ms:0")
