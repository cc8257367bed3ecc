"""Where the reading runs: inline, or a local process pool sized to the CPUs we may use.

:class:`LocalPool` is the executor the audit hands its read tasks to (one pool serves every
stage of the collection, started on first use, shut down by :meth:`LocalPool.close`).
Small studies are read inline: starting a pool costs more than a second core saves.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import TypeVar

from auditor._process import helper_args, helper_context, helper_signals, signals_deferred

T = TypeVar("T")
R = TypeVar("R")

SMALL_STUDY_TASKS = 1000
"""...and below this many attempts (many small files pay for a pool too)."""
SMALL_STUDY_BYTES = 64 << 20
"""Below this many listed bytes the audit reads in-process: starting a pool costs more
(about 0.3 s) than a second core saves."""
CHUNK_BYTES = 16 << 20
"""About the most listed bytes of tasks sent to a worker at once (see :meth:`LocalPool.map`)."""


def usable_cpus(cgroup: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> int:
    """How many CPUs this process may use: the default number of workers.

    Not :func:`os.cpu_count`, which counts the machine's: inside a SLURM job (its cgroup
    cpuset), under ``taskset`` or in a container pinned to some cores, the process may run
    on only a few of a node's many; under a CPU quota (``docker --cpus``, a Kubernetes
    limit, a systemd slice's ``CPUQuota``), on as many as the tightest quota over it allows,
    rounded up. ``cgroup`` is where the cgroup file system is mounted, ``own`` the file
    naming the process's group. A worker per CPU of the node would crowd them, and hold
    tens of MB each."""
    try:
        cpus = len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # (no affinity on this platform)
        cpus = os.cpu_count() or 1
    return min([cpus, *_cpu_quotas(cgroup, own)])


def _cpu_quotas(cgroup: str, own: str) -> list[int]:
    """The CPUs each CPU bandwidth limit over this process allows, rounded up: cgroup v2's
    ``cpu.max`` of its own group and of each group above it (up to the mount's root: in a
    container's namespace, the container's), cgroup v1's CFS quota at the root."""
    try:
        with open(own) as handle:  # ("0::/path": the process's group in cgroup v2)
            path = next((line[3:].strip() for line in handle if line.startswith("0::")), "/")
    except (OSError, ValueError):
        path = "/"
    parts = [part for part in path.split("/") if part]
    if ".." in parts:  # (a group outside the namespace: only the root can be seen)
        parts = []
    files: list[tuple[str, str | None]] = [
        (f"{cgroup}/{'/'.join(parts[:depth])}/cpu.max".replace("//", "/"), None)
        for depth in range(len(parts), -1, -1)]
    files.append((f"{cgroup}/cpu/cpu.cfs_quota_us", f"{cgroup}/cpu/cpu.cfs_period_us"))
    allowed = []
    for quota_file, period_file in files:
        try:
            with open(quota_file) as handle:
                quota, _, period = handle.read().strip().partition(" ")
            if period_file is not None:
                with open(period_file) as handle:
                    period = handle.read().strip()
            cpus = math.ceil(int(quota) / int(period))
        except (OSError, ValueError, ZeroDivisionError):  # ("max" or -1: no quota)
            continue
        if cpus > 0:
            allowed.append(cpus)
    return allowed


class LocalPool:
    """Runs tasks inline or in a process pool of ``jobs`` workers (0: :func:`usable_cpus`).

    ``explicit``: the number of workers was asked for (``--jobs``), so even a small study
    goes to the pool."""

    def __init__(self, jobs: int = 0) -> None:
        self.explicit = jobs != 0
        self._jobs = jobs or usable_cpus()
        """Readers (the CPUs this process may use unless ``--jobs`` says): settled once."""
        self._pool: ProcessPoolExecutor | None = None

    def close(self) -> None:
        """Shut the pool down (if one was started), cancelling what it has not begun."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            # never cut short by a signal: a pool half shut down at exit makes
            # Python's own exit hook fail on a closed pipe (and print a traceback)
            with signals_deferred():
                pool.shutdown(cancel_futures=True)

    def soon(self, function: Callable[[T], R], item: T, tasks: int) -> Callable[[], R]:
        """Start ``function(item)`` in the pool when the ``tasks`` that follow it go to one
        (it runs beside them and beside this process); the returned call gives its result
        (or raises its error). Without a pool, ``function`` runs at that call."""
        if not self._pooled(tasks, 0):
            return partial(function, item)
        pool = self._open_pool()
        with signals_deferred():  # (see map)
            return pool.submit(function, item).result

    def _pooled(self, tasks: int, total_bytes: int) -> bool:
        """Whether ``tasks`` tasks over ``total_bytes`` listed bytes go to a pool."""
        small = not self.explicit and total_bytes < SMALL_STUDY_BYTES \
            and tasks < SMALL_STUDY_TASKS
        return self._jobs > 1 and not small and tasks >= 2

    def _open_pool(self) -> ProcessPoolExecutor:
        """The pool (one serves every stage of the collection), started on first use."""
        if self._pool is None:
            # kept before its workers start: a signal held meanwhile is raised as the
            # block ends, and the pool must then be there for run() to shut down
            context = helper_context()
            self._pool = ProcessPoolExecutor(max_workers=self._jobs,
                                             mp_context=context, initializer=helper_signals,
                                             initargs=helper_args(context))
            with signals_deferred():  # (forked at the first task: born with signals held)
                self._pool.submit(int)
        return self._pool

    def map(self, function: Callable[[T], R], items: Iterable[T],
             total_bytes: int) -> Iterator[R]:
        """Run ``function`` over ``items`` inline or in a process pool, in order. In a
        pool, every task is sent at once (the results wait for the caller); inline, each
        runs as its result is taken."""
        items = list(items)
        if not self._pooled(len(items), total_bytes):
            pending = deque(items)  # each task is let go once done
            del items
            return (function(pending.popleft()) for _ in range(len(pending)))
        jobs = self._jobs
        # Tasks go to the workers in chunks (fewer messages), but a chunk holds about
        # CHUNK_BYTES of files (by the average task): the last chunk a worker takes is
        # then short work, not seconds of it while the other core idles.
        per_item = total_bytes // len(items)
        chunksize = max(1, min(64, len(items) // (jobs * 8), CHUNK_BYTES // max(per_item, 1)))
        pool = self._open_pool()
        # submitting is not cut short by a signal either (like starting and shutting the
        # pool down): the pool's bookkeeping is not built to be interrupted half-way
        with signals_deferred():
            return pool.map(function, items, chunksize=chunksize)

