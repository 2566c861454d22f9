"""A worker's CPU math (paddle's, or torch's through its environment), set up once per process.

Two things decide how fast a worker computes on a CPU:

* **MKL on AMD.** paddle's CPU wheel does its matrix products with Intel MKL,
  which dispatches a generic SSE code path on CPUs whose vendor is not Intel.
  On the AMD EPYC development machines a 2048x384x1536 product ran at 32 GFLOP/s
  per core that way, and at 84 GFLOP/s with the AVX2 path that
  ``MKL_DEBUG_CPU_TYPE=5`` selects (numpy's OpenBLAS: 101). MKL reads the
  variable at its first call, so setting it here, before any product, is enough.
  On Intel CPUs nothing is changed (MKL already picks its best path there).
* **Threads.** Two workers and their brokers share a small machine; each worker
  takes its share of the cores (``NEBULA_THREADS``, set by ``nebula-mq run`` for
  every worker it starts), not all of them.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from functools import lru_cache

THREADS_ENV = "NEBULA_THREADS"


@lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """``AuthenticAMD``, ``GenuineIntel``... or ``""`` when /proc/cpuinfo says nothing."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def threads_from_env(environ: os._Environ[str] | dict[str, str] | None = None) -> int:
    """This worker's share of the cores: ``NEBULA_THREADS``, else every core."""
    env = os.environ if environ is None else environ
    raw = env.get(THREADS_ENV, "")
    if raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    return max(1, len(os.sched_getaffinity(0)))


def select_mkl_code_path() -> None:
    """MKL's AVX2 code path on AMD CPUs (see the module docstring); a no-op elsewhere.

    Called when ``nebula_mq.models`` is imported, before any matrix product, so every
    process that builds a model (workers, tests, benchmarks) gets it."""
    if cpu_vendor() == "AuthenticAMD":
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")


def thread_share_env(processes: int) -> dict[str, str]:
    """Environment giving each of ``processes`` workers on this machine its share of the
    cores: set before the worker starts (MKL and OpenMP read it once, at load time)."""
    cores = max(1, len(os.sched_getaffinity(0)))
    share = str(max(1, cores // max(1, processes)))
    return {name: share for name in (THREADS_ENV, "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


# The share a worker took before it knew its model's framework (configure_cpu(paddle=False)):
# paddle's adapter applies it if the model turns out to be paddle's. Unset elsewhere, so
# building an adapter in a process that never called configure_cpu changes nothing.
_deferred_paddle_threads: int | None = None


def configure_cpu(threads: int | None = None, *, paddle: bool = True) -> int:
    """Select MKL's AVX2 path on AMD and this process's share of the cores; returns the count.

    ``paddle``: the process computes with paddle (the ABNet and ELECTRA roles), so paddle's
    math threads are set now, where paddle is installed (a torch-only machine, such as a GPU
    host, has none). A split or replicas worker's model may be PyTorch: it passes ``False``,
    and the paddle adapter applies the share if a paddle model turns up
    (:func:`apply_deferred_paddle_threads`), so a torch worker never loads paddle (1.1 s and
    ~340 MB a process here) beside torch, which reads its share from ``OMP_NUM_THREADS``
    (:func:`thread_share_env`) at import."""
    global _deferred_paddle_threads
    select_mkl_code_path()
    # paddle warns at import that ccache is missing, which matters only to compiling custom
    # C++ operators: left alone, it opened every worker's log as a warning at every start.
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
    n = threads if threads is not None else threads_from_env()
    _deferred_paddle_threads = None if paddle else n
    if paddle and importlib.util.find_spec("paddle") is not None:
        use_paddle_threads(n)
    return n


def apply_deferred_paddle_threads() -> None:
    """paddle's math threads as this process's ``configure_cpu(paddle=False)`` chose them, once;
    nothing where it was not called."""
    global _deferred_paddle_threads
    if _deferred_paddle_threads is not None:
        n, _deferred_paddle_threads = _deferred_paddle_threads, None
        use_paddle_threads(n)


def use_paddle_threads(n: int) -> None:
    """paddle's math threads: ``n`` (imports paddle)."""
    import paddle

    paddle.base.core.set_num_threads(n)
