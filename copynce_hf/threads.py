"""How many threads the commands and the training loop use, and how the idle ones wait.

On a machine shared with other work, PyTorch's default (one OpenMP thread per core, spinning while it waits
for the others) burns CPU time on cores it does not get: ``copynce detect`` on the bundled images beside two
busy processes on two cores cost 2.8 times its idle CPU time. The policy here, applied once by each entry
point before torch is imported:

* the thread count is the number of cores this process may run on (its CPU affinity) less the cores other
  processes keep busy when it starts (the runnable processes Linux counts, read for a tenth of a second), at
  least one;
* idle threads wait passively (``OMP_WAIT_POLICY=PASSIVE``): they sleep instead of spinning, after a short spin
  (``GOMP_SPINCOUNT``, :data:`SPIN_COUNT`): a thread that slept at once would be woken for each of the many small
  operations of a matcher's fusion passes (one pair each).

What a user set wins: an ``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in the environment is kept (a
wait policy of the user's gets no spin count of ours), and
``COPYNCE_THREADS`` names a count for the commands alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import sys
import time

logger = logging.getLogger(__name__)

__all__ = ["SPIN_COUNT", "ThreadPolicy", "apply_thread_policy", "busy_cores", "choose_threads", "usable_cores"]

#: Environment variables read by the OpenMP, MKL and OpenBLAS runtimes when they start.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: Spins (GNU OpenMP's ``GOMP_SPINCOUNT``) an idle thread waits for more work before it sleeps: tens of microseconds,
#: about the gap between two small operations; chosen on the speed task (benchmarks/LOG.md, "Detect within 35 seconds").
SPIN_COUNT = 10_000


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; all cores where the system has none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cores(samples: int = 10, interval: float = 0.01) -> float:
    """Cores other processes keep busy now: the runnable processes besides this one, the median of ``samples``
    readings of Linux's ``procs_running`` ``interval`` seconds apart (about 0.1 s); where there is no
    ``/proc/stat``, the one-minute load average (which lags, and counts this program's own earlier runs)."""
    readings = []
    for index in range(samples):
        try:
            with open("/proc/stat", encoding="ascii") as handle:
                readings += [int(line.split()[1]) - 1 for line in handle if line.startswith("procs_running ")]
        except (OSError, ValueError):
            break
        if index + 1 < samples:
            time.sleep(interval)
    if readings:
        return float(statistics.median(readings))
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def choose_threads(cores: int, busy: float) -> int:
    """Threads for ``cores`` usable cores of which ``busy`` (runnable processes, or a load average) are taken:
    the free ones, >= 1. A core counts as taken from half a process on it (0.4 leaves both of two cores)."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    return max(1, min(cores, cores - int(busy + 0.5)))


@dataclasses.dataclass(frozen=True)
class ThreadPolicy:
    """The thread count and wait policy one entry point runs with, and where the count came from."""

    threads: int
    source: str
    wait_policy: str
    spin_count: str | None = None

    def describe(self) -> str:
        """One log line: ``threads: 1 (2 usable cores, 1.6 busy); OpenMP wait policy PASSIVE after 10000 spins``."""
        spin = f" after {self.spin_count} spins" if self.spin_count is not None else ""
        return f"threads: {self.threads} ({self.source}); OpenMP wait policy {self.wait_policy}{spin}"


def _requested_threads(environ) -> tuple[int, str] | None:
    """An explicit count: ``COPYNCE_THREADS``, then ``OMP_NUM_THREADS``; ``None`` where neither is set."""
    for name in ("COPYNCE_THREADS", "OMP_NUM_THREADS"):
        text = environ.get(name, "").strip()
        if not text:
            continue
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            from .modeling.errors import ConfigError

            raise ConfigError(f"{name}={text!r}: a positive whole number of threads is expected")
        return value, f"{name}={value}"
    return None


def apply_thread_policy(environ=None) -> ThreadPolicy:
    """Choose the thread count and the wait policy and set them for this process (``environ``: ``os.environ``).

    Called before torch is imported, it sets the environment the OpenMP runtime reads when it starts; where
    torch (or faiss) is already imported, their thread counts are set too (the wait policy then stays as the
    runtime started with it).
    """
    environ = os.environ if environ is None else environ
    requested = _requested_threads(environ)
    if requested is None:
        cores, busy = usable_cores(), busy_cores()
        threads, source = choose_threads(cores, busy), f"{cores} usable cores, {busy:.1f} busy"
    else:
        threads, source = requested
    for name in THREAD_VARIABLES:
        environ[name] = str(threads)
    if "OMP_WAIT_POLICY" not in environ:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
    if environ is os.environ:
        _set_loaded_runtimes(threads)
    policy = ThreadPolicy(threads, source, environ["OMP_WAIT_POLICY"], environ.get("GOMP_SPINCOUNT"))
    logger.info(policy.describe())
    return policy


def _set_loaded_runtimes(threads: int) -> None:
    """``torch.set_num_threads`` / ``faiss.omp_set_num_threads`` where those are imported already."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    if "faiss" in sys.modules:
        sys.modules["faiss"].omp_set_num_threads(threads)
