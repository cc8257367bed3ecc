"""Where the reading runs: inline, in a local process pool sized to the CPUs we may use, or
on a Dask cluster.

:func:`make_pool` gives the executor the audit hands its read tasks to: a :class:`LocalPool`
(one pool serves every stage of the collection, started on first use, shut down by
:meth:`LocalPool.close`; small studies are read inline: starting a pool costs more than a
second core saves), or with ``executor="dask://HOST:PORT"`` a :class:`DaskPool`, which sends
every task to that cluster's scheduler whatever the study's size. Both have the three
methods of :class:`Pool`; every task function is a top-level function of a module the
workers import.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import pickle
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from functools import partial
from itertools import islice
from typing import Any, Generic, Protocol, TypeVar

from auditor._signals import helper_args, helper_context, helper_signals, signals_deferred
from auditor.errors import OutputError, UsageError
from auditor.store import spill_directory
from auditor.store.heap import release_free_memory

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")

SMALL_STUDY_TASKS = 1000
"""...and below this many attempts (many small files pay for a pool too)."""
SMALL_STUDY_BYTES = 64 << 20
"""Below this many listed bytes the audit reads in-process: starting a pool costs more
(about 0.3 s) than a second core saves."""
CHUNK_BYTES = 16 << 20
"""About the most listed bytes of tasks sent to a worker at once (see :func:`chunk_size`)."""
CONNECT_TIMEOUT = 10
CONNECT_MARGIN = 5
"""Seconds past the connect timeout the connecting thread is waited on."""
"""Seconds a :class:`DaskPool` waits for its scheduler to answer before giving up."""
CLOSE_TIMEOUT = 10
"""Seconds a :class:`DaskPool` waits for its client to close."""
DASK_SCHEME = "dask://"
DASK_PORT = 8786
"""The Dask scheduler's usual port (``dask://HOST`` means ``HOST:8786``)."""


class Pool(Protocol):
    """Where the audit's tasks run (:func:`make_pool`)."""

    def soon(self, function: Callable[[T], R], item: T, tasks: int) -> Callable[[], R]:
        """Start ``function(item)``; the returned call gives its result (call it once)."""

    def map(self, function: Callable[[T], R], items: Iterable[T],
            total_bytes: int, count: int | None = None) -> Iterator[R]:
        """``function`` over ``items``, the results in order (``count``: how many items
        there are, when ``items`` is made as it is taken)."""

    def map_shared(self, function: Callable[[S, T], R], shared: S, items: Iterable[T],
                   tasks: int, total_bytes: int) -> Iterator[R]:
        """``function(shared, item)`` over ``items``, each item one task, the results in
        order; ``shared`` goes to each worker once (``tasks`` and ``total_bytes``: the
        work the items hold, which decides whether they go to workers at all)."""

    def width(self, tasks: int, total_bytes: int) -> int:
        """How many tasks at once ``tasks`` tasks over ``total_bytes`` would run (1 when
        they run in this process)."""

    def close(self) -> None:
        """Let go of the workers, cancelling what they have not done."""


class PoolOptions(Protocol):
    """What :func:`make_pool` reads of the audit's options."""

    @property
    def jobs(self) -> int: ...

    @property
    def executor(self) -> str | None: ...


def make_pool(options: PoolOptions) -> Pool:
    """The pool ``options`` ask for: a :class:`DaskPool` for ``executor="dask://HOST:PORT"``,
    else a :class:`LocalPool` of ``jobs`` workers. A malformed ``executor``, or one whose
    library is not installed, is a :class:`~auditor.errors.UsageError` (nothing connects
    until the first task)."""
    if options.executor is None:
        return LocalPool(options.jobs)
    return DaskPool(options.executor)


def chunk_size(count: int, total_bytes: int, workers: int) -> int:
    """How many of ``count`` tasks over ``total_bytes`` listed bytes go to a worker at once.

    Fewer, larger messages, but a chunk holds about :data:`CHUNK_BYTES` of files (by the
    average task), and every worker gets about eight: the last chunk a worker takes is
    then short work, not seconds of it while the other cores idle."""
    per_item = total_bytes // max(count, 1)
    return max(1, min(64, count // (max(workers, 1) * 8), CHUNK_BYTES // max(per_item, 1)))


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
        self._shared: list[str] = []
        """The temporary files of what :meth:`map_shared` sent to the workers."""

    def close(self) -> None:
        """Shut the pool down (if one was started), cancelling what it has not begun, and
        remove what was shared with its workers."""
        # never cut short by a signal: a pool half shut down at exit makes Python's own
        # exit hook fail on a closed pipe (and print a traceback), and a second Ctrl-C
        # raised between the shutdown and the unlink left the shared file behind
        with signals_deferred():
            if self._pool is not None:
                pool, self._pool = self._pool, None
                pool.shutdown(cancel_futures=True)
            while self._shared:
                with contextlib.suppress(OSError):
                    os.unlink(self._shared.pop())

    def width(self, tasks: int, total_bytes: int) -> int:
        """The workers ``tasks`` tasks over ``total_bytes`` would go to (1: inline)."""
        return self._jobs if self._pooled(tasks, total_bytes) else 1

    def map_shared(self, function: Callable[[S, T], R], shared: S, items: Iterable[T],
                   tasks: int, total_bytes: int) -> Iterator[R]:
        """``function(shared, item)`` over ``items``, inline or in the pool (as
        :meth:`map` decides for ``tasks`` tasks over ``total_bytes``), each item one task
        sent :data:`AHEAD` per worker ahead of the caller. ``shared`` is pickled once to a
        temporary file (removed by :meth:`close`) that each worker loads once: a study's
        scheduler dump is not sent with every batch."""
        pending = iter(items)
        if not self._pooled(tasks, total_bytes):
            return (function(shared, item) for item in pending)
        pool = self._open_pool()
        path = self._share(shared)

        def send(chunk: list[T]) -> Future[list[R]]:
            return pool.submit(_each_shared, function, path, chunk)

        return windowed(send, Future.result, pending, 1, AHEAD * self._jobs)

    def _share(self, shared: object) -> str:
        """``shared`` pickled to a temporary file of this process's own (mode 0600)."""
        try:
            handle, path = tempfile.mkstemp(prefix="auditor-shared-", suffix=".pickle",
                                            dir=spill_directory())
            self._shared.append(path)
            with os.fdopen(handle, "wb") as file:
                pickle.dump(shared, file, protocol=5)
        except OSError as error:
            raise OutputError(
                f"cannot keep what the audit's workers share in the temporary directory "
                f"{spill_directory()} ({error.strerror or error}); point TMPDIR at a "
                "directory with room") from None
        return path

    def soon(self, function: Callable[[T], R], item: T, tasks: int) -> Callable[[], R]:
        """Start ``function(item)`` in the pool when the ``tasks`` that follow it go to one
        (it runs beside them and beside this process); the returned call gives its result
        (or raises its error), once. Without a pool, ``function`` runs at that call. The
        worker sends the result pickled (:func:`_pickled_there`)."""
        if not self._pooled(tasks, 0):
            return partial(function, item)
        pool = self._open_pool()
        with signals_deferred():  # (see map)
            sent = [pool.submit(_pickled_there, function, item)]

        def result() -> R:  # (once: the future, and the result's bytes, go as it is taken)
            made: R = pickle.loads(sent.pop().result())  # noqa: S301 - our worker's bytes
            return made

        return result

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
            total_bytes: int, count: int | None = None) -> Iterator[R]:
        """Run ``function`` over ``items`` inline or in a process pool, in order. In a
        pool, chunks of tasks go out :data:`AHEAD` per worker ahead of the caller (the next
        as each result is taken: a caller slower than the workers holds no more results
        than that); inline, each runs as its result is taken. ``items`` is taken only as
        tasks go out (a generator of them is made as it goes) when ``count`` says how many
        there are."""
        if count is None:
            items = deque(items)  # each task is let go once sent (or done)
            count = len(items)
        pending = iter(items)
        if not self._pooled(count, total_bytes):
            return (function(item) for item in pending)
        return self._ahead(function, pending, chunk_size(count, total_bytes, self._jobs))

    def _ahead(self, function: Callable[[T], R], pending: Iterator[T], chunksize: int
               ) -> Iterator[R]:
        pool = self._open_pool()

        def send(chunk: list[T]) -> Future[list[R]]:
            return pool.submit(_each, function, chunk)

        return windowed(send, Future.result, pending, chunksize, AHEAD * self._jobs)


def windowed(send: Callable[[list[T]], Future[list[R]]],
             take: Callable[[Future[list[R]]], list[R]], pending: Iterator[T], size: int,
             window: int) -> Iterator[R]:
    """The results of ``pending``'s tasks, in order: chunks of ``size`` tasks go out
    (``send``) at most ``window`` ahead of the caller, the first ``window`` at this call
    (the pool works while the caller does something else: the audit walks the study as
    its period records are read), the next as each chunk's results are taken (``take``);
    a task is made only as its chunk goes."""
    sent: deque[Future[list[R]]] = deque()

    def more() -> bool:
        chunk = list(islice(pending, size))
        if chunk:
            # submitting is not cut short by a signal (like starting and shutting a pool
            # down): its bookkeeping is not built to be interrupted
            with signals_deferred():
                sent.append(send(chunk))
        return bool(chunk)

    while len(sent) < window and more():
        pass
    return _taken(sent, take, more)


def _taken(sent: deque[Future[list[R]]], take: Callable[[Future[list[R]]], list[R]],
           more: Callable[[], bool]) -> Iterator[R]:
    while sent:
        results = take(sent.popleft())
        more()
        yield from results


AHEAD = 8
"""Chunks of tasks sent ahead per worker: results come back in order, so a slow chunk must
not leave the workers idle behind it (the results of a chunk are far smaller than its
files: 16 chunks of a many-file study's hold about 10 MB)."""


def _pickled_there(function: Callable[[T], R], item: T) -> bytes:
    """``function(item)`` pickled in the worker that made it, then a collection and the C
    heap trimmed before the worker goes on (:meth:`LocalPool.soon`: one large result, a
    scheduler dump's). The collector is paused in the workers, as in the audit's process,
    and what making and pickling a large result left only a collection gives back: sent
    as objects (the executor pickling them after the task), the worker that parsed a
    million files' dump (55,556 jobs) held 76-87 MB of PSS for the rest of the audit;
    pickled here and collected, 24 MB (pickled here alone: 76 MB; trimmed alone: 88)."""
    data = pickle.dumps(function(item), protocol=5)
    gc.collect()
    release_free_memory()
    return data


def _each(function: Callable[[T], R], chunk: list[T]) -> list[R]:
    """``function`` over a chunk of tasks, in a worker."""
    return [function(item) for item in chunk]


_SHARED: list[tuple[str, Any]] = []
"""In a worker: what :meth:`LocalPool.map_shared` shared last, by its file (loaded once)."""


def _each_shared(function: Callable[[Any, T], R], path: str, chunk: list[T]) -> list[R]:
    """``function(shared, item)`` over a chunk of tasks, in a worker, ``shared`` loaded
    from ``path`` the first time it is named."""
    if not _SHARED or _SHARED[0][0] != path:
        _SHARED.clear()
        with open(path, "rb") as handle:
            _SHARED.append((path, pickle.load(handle)))  # noqa: S301 - this audit's own file
    shared = _SHARED[0][1]
    return [function(shared, item) for item in chunk]


class Batch(Generic[T, R]):
    """Tasks sent to a Dask worker as one: ``function`` over each of ``items``.

    A plain class (not a tuple, list or dataclass, which Dask would walk in search of
    futures to substitute): it goes to the worker whole, pickled once."""

    __slots__ = ("function", "items")

    def __init__(self, function: Callable[[T], R], items: Sequence[T]) -> None:
        self.function = function
        self.items = items

    def __reduce__(self) -> tuple[Any, ...]:
        return Batch, (self.function, self.items)


def run_batch(batch: Batch[Any, R], *shared: Any) -> list[R]:
    """On a Dask worker: the results of a :class:`Batch`, in order; with ``shared`` (the
    cluster's copy of what :meth:`DaskPool.map_shared` scattered), of ``function(shared,
    item)`` for each item."""
    if shared:
        function: Callable[[Any, Any], R] = batch.function  # type: ignore[assignment]
        return [function(shared[0], item) for item in batch.items]
    return [batch.function(item) for item in batch.items]


def scheduler_address(executor: str) -> str:
    """The scheduler address (``tcp://HOST:PORT``) of ``dask://HOST[:PORT]``; a
    :class:`~auditor.errors.UsageError` for anything else, before any connection is tried:
    no host, a port that is not a number from 1 to 65535 (port 0 would mean "any port",
    never a scheduler's), a path, query, fragment or user. HOST is a name, an IPv4 address
    or a bracketed IPv6 one; without ``:PORT`` the port is Dask's usual 8786."""
    import ipaddress
    import re

    usage = f"--executor {executor!r}: expected dask://HOST:PORT (a Dask scheduler's address)"

    def refused(why: str = "") -> UsageError:
        return UsageError(f"{usage}{'; ' + why if why else ''}")

    if not executor.startswith(DASK_SCHEME):
        raise refused()
    authority, _, path = executor[len(DASK_SCHEME):].partition("/")
    if path or any(c in authority for c in "?#@"):
        raise refused()
    shape = re.fullmatch(r"(?:\[(?P<ipv6>[^\]]*)\]|(?P<name>[^:\[\]]*))(?::(?P<port>.*))?",
                         authority, re.DOTALL)
    if shape is None:
        raise refused()
    host = shape["name"] if shape["ipv6"] is None else shape["ipv6"]
    if not host:
        raise refused("no host" + (" (an IPv6 address goes in brackets: dask://[ADDRESS]:PORT)"
                                   if authority.count(":") > 1 else ""))
    if shape["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise refused(f"[{host}] is not an IPv6 address") from None
    elif not re.fullmatch(r"[A-Za-z0-9_.-]+", host):
        raise refused(f"{host!r} is not a host name or address")
    port = DASK_PORT
    if shape["port"] is not None:
        if not re.fullmatch(r"[0-9]{1,5}", shape["port"]) \
                or not 1 <= int(shape["port"]) <= 65535:
            raise refused(f"the port {shape['port']!r} is not a number from 1 to 65535")
        port = int(shape["port"])
    return f"tcp://[{host}]:{port}" if shape["ipv6"] is not None else f"tcp://{host}:{port}"


class DaskPool:
    """Runs every task on a Dask cluster, through its client's
    :class:`~concurrent.futures.Executor` (``Client.get_executor``), whatever the study's
    size: the cluster was asked for.

    Its executor's ``map`` ignores ``chunksize``, so tasks are sent in :class:`Batch` es of
    :func:`chunk_size` (over the cluster's worker threads), one Dask task each. Results
    come back as they are done and wait here (as a process pool's do); the workers keep
    none. The client connects on first use and is closed by :meth:`close`, which cancels
    every task not done yet (an interrupted audit leaves the cluster idle). The workers
    open the files by the paths this process resolved: they must see the study at the
    same path (a shared file system)."""

    def __init__(self, executor: str) -> None:
        import importlib.util

        self.executor = executor
        self.address = scheduler_address(executor)
        if importlib.util.find_spec("distributed") is None:
            raise UsageError(f"--executor {executor}: Dask's 'distributed' is not installed "
                             "(pip install 'auditor[dask]')")
        self._client: Any = None
        self._pool: Any = None  # (the client's executor)
        self._threads = 1
        self._levels: list[tuple[Any, int]] = []  # (see _hush)

    def close(self) -> None:
        """Cancel the tasks not done yet and close the client (if it was opened)."""
        if self._client is not None:
            client, self._client = self._client, None
            pool, self._pool = self._pool, None
            with signals_deferred():  # (a client half closed leaves its thread behind)
                if pool is not None:
                    pool.shutdown(wait=False)  # (cancels what it has not finished)
                client.close(timeout=CLOSE_TIMEOUT)
        while self._levels:  # (Dask's log lines as they were)
            logger, level = self._levels.pop()
            logger.setLevel(level)

    def soon(self, function: Callable[[T], R], item: T, tasks: int) -> Callable[[], R]:
        """Start ``function(item)`` on the cluster; the returned call gives its result."""
        pool = self._open()
        with signals_deferred():
            future = pool.submit(run_batch, Batch(function, (item,)))
        return partial(self._first, future)

    def _first(self, future: Future[list[R]]) -> R:
        return self._result(future)[0]

    def map(self, function: Callable[[T], R], items: Iterable[T],
            total_bytes: int, count: int | None = None) -> Iterator[R]:
        """Run ``function`` over ``items`` on the cluster, in order: batches go out
        :data:`AHEAD` per worker thread ahead of the caller, as a process pool's chunks
        do (``items`` is taken only as they go when ``count`` says how many there are;
        the cluster is reached at this call, its first use)."""
        if count is None:
            items = deque(items)
            count = len(items)
        if not count:
            return iter(())
        pool = self._open()
        size = chunk_size(count, total_bytes, self._threads)

        def send(chunk: list[T]) -> Future[list[R]]:
            return pool.submit(run_batch, Batch(function, chunk))

        return windowed(send, self._result, iter(items), size, AHEAD * self._threads)

    def width(self, tasks: int, total_bytes: int) -> int:
        """The cluster's worker threads (it is reached at this call, its first use)."""
        self._open()
        return self._threads

    def map_shared(self, function: Callable[[S, T], R], shared: S, items: Iterable[T],
                   tasks: int, total_bytes: int) -> Iterator[R]:
        """``function(shared, item)`` over ``items`` on the cluster, each item one task
        sent :data:`AHEAD` per worker thread ahead of the caller; ``shared`` is scattered
        to every worker once."""
        pool = self._open()
        with signals_deferred():
            future = self._client.scatter(shared, broadcast=True, hash=False)

        def send(chunk: list[T]) -> Future[list[R]]:
            return pool.submit(run_batch, Batch(function, chunk), future)  # type: ignore[arg-type]

        return windowed(send, self._result, iter(items), 1, AHEAD * self._threads)

    def _result(self, future: Future[list[R]]) -> list[R]:
        """A batch's results; a cluster that lost it (its scheduler gone, its workers
        killed) is a :class:`~auditor.errors.UsageError` saying so. An error of the task
        itself is raised as it is."""
        from distributed import KilledWorker

        try:
            return future.result()
        except (CancelledError, KilledWorker) as error:
            why = f": {error}" if str(error) else ""
            raise UsageError(f"--executor {self.executor}: the Dask cluster lost the audit's "
                             f"work (its scheduler or a worker went away; "
                             f"{type(error).__name__}{why})") from None

    def _open(self) -> Any:
        """The client's executor, connected on first use."""
        if self._pool is None:
            # kept as it is made: a signal held meanwhile is raised as the block ends, and
            # the client must then be there for close()
            with signals_deferred():
                from distributed import Client

                self._hush()
                self._client = self._connect(Client)
                self._pool = self._client.get_executor(pure=False)
                self._threads = max(1, sum(self._client.nthreads().values()))
        return self._pool

    def _connect(self, client_class: Any) -> Any:
        """A client of the scheduler, made in a thread waited on for at most the connect
        timeout (and a margin): a port that accepts but speaks no Dask (a silent server, a
        web server) would otherwise hold the handshake for ever, past Dask's own timeout."""
        import threading

        made: dict[str, Any] = {}

        def connect() -> None:
            try:
                made["client"] = client_class(self.address, timeout=CONNECT_TIMEOUT,
                                              set_as_default=False)
            except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
                made["error"] = error

        thread = threading.Thread(target=connect, name="auditor-dask-connect", daemon=True)
        thread.start()
        thread.join(CONNECT_TIMEOUT + CONNECT_MARGIN)
        error = made.get("error")
        if thread.is_alive() or (error is None and "client" not in made):
            raise UsageError(f"--executor {self.executor}: no Dask scheduler answered at "
                             f"{self.address} within {CONNECT_TIMEOUT} s (something listens "
                             "there, but it speaks no Dask)")
        if isinstance(error, OSError | TimeoutError):
            why = "" if str(error).startswith("Timed out") else f" ({error})"
            raise UsageError(f"--executor {self.executor}: no Dask scheduler answered at "
                             f"{self.address} within {CONNECT_TIMEOUT} s{why}") from None
        if error is not None:
            raise UsageError(f"--executor {self.executor}: what answered at {self.address} is "
                             f"no Dask scheduler ({type(error).__name__}: {error})") from None
        return made["client"]

    def _hush(self) -> None:
        """Hold back the log lines of Dask's client side (they go to stderr) until
        :meth:`close`: a scheduler lost half-way would print tracebacks of its reconnection
        attempts, and cancelling the batches not done (an interrupted audit) may make the
        client's event loop log one per batch, through tornado's logger (a batch cancelled
        while its result is awaited raises there). What went wrong is this pool's
        exception, in one line."""
        import logging

        names = ["distributed", "tornado", *(
            name for name in logging.root.manager.loggerDict
            if name.startswith(("distributed.", "tornado.")))]
        for name in names:
            logger = logging.getLogger(name)
            self._levels.append((logger, logger.level))
            logger.setLevel(logging.CRITICAL + 1)
