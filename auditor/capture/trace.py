"""The allocator trace a training process writes:
``allocator-traces/allocator-<host>-<pid>.jsonl``.

One :class:`Trace` per process (torchrun rank, Ray actor...): the file is named by the node
and ``os.getpid()`` (contract v1.2: two nodes' processes may share a pid), each phase record
names the host too, and the device file's ``nspid`` maps the pid to the host's, which NVML
reports. Each record is one ``os.write`` of one whole line on a descriptor opened with
``O_APPEND`` (no user-space buffer to lose): a process killed at any instant leaves whole
lines, at worst without the one it was writing, which the audit reads up to its last whole
line. The kernel holds what was written even when the process dies; only a node crash
can lose it (``Trace.close`` fsyncs). A trace of its name that this process did not open is
never appended to: nodes that report one hostname, each in its own pid namespace, give their
processes one name, and the second is refused at once (``NameTaken``, a
``FileExistsError``), before any GPU time is spent on evidence no audit could tell apart.

``trace.phase(name, step)`` writes its record in ``finally``: a phase that raises still
leaves it, with ``error_type`` the exception's qualified name (``torch.OutOfMemoryError``)
and ``error_message``, and the exception goes on unchanged.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from auditor._text import json_line
from auditor.capture._files import attempt_dir_of, hostname, open_own, own_folder, rank_of
from auditor.capture.memory import Memory
from auditor.model.kinds import ALLOCATOR_TRACE


def qualified_name(error: BaseException) -> str:
    """``torch.OutOfMemoryError`` for torch's, ``ValueError`` for a builtin, else
    ``module.Qualname``."""
    kind = type(error)
    module = kind.__module__
    if module in (None, "builtins", "__main__"):
        return kind.__qualname__
    return f"{module}.{kind.__qualname__}"


class Trace:
    """This process's allocator trace (a context manager: ``with Trace(dir, rank) as t``).

    ``sample_every`` (seconds) starts a background thread taking a :meth:`sample` that
    often until the trace is closed. Memory comes from ``torch.cuda`` when torch with CUDA
    is there (peaks reset at each phase's entry), else every figure is ``null``.
    """

    def __init__(self, attempt_dir: str | os.PathLike[str] | None = None,
                 rank: int | None = None, role: str = "actor_rollout", *,
                 sample_every: float | None = None, memory: Memory | None = None) -> None:
        self.pid = os.getpid()
        self.host = hostname()
        self.rank = rank_of(rank)
        self.role = role
        self.memory = memory if memory is not None else Memory()
        self.path = trace_path(attempt_dir_of(attempt_dir), self.pid, self.host)
        own_folder(self.path.parent)
        # a file of this name that this process did not open is another process's, of the same
        # host name and pid (nodes reporting one hostname, each in its own pid namespace):
        # never appended to (two writers' records in one trace tell no worker apart)
        self._fd: int | None = open_own(  # (never through a link put in its place)
            self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW,
            "the allocator trace of this host and pid")
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.peak_allocated_bytes: int | None = None
        """The highest phase peak written so far (None: not measured)."""
        self.peak_reserved_bytes: int | None = None
        if sample_every is not None:
            self.start_sampler(sample_every)

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def phase(self, name: str, step: int = 0, *, params: Any = None) -> _Phase:
        """A context manager and a decorator writing one phase record per entry. With
        ``params`` (a torch module, or its parameters), a digest of its trainable parameters
        is recorded before and after (contract v1.2: did the update change anything?)."""
        return _Phase(self, name, step, params)

    def params(self, model: Any, step: int, when: str, phase: str = "") -> None:
        """Write one ``params`` record: the digest of ``model``'s trainable parameters at
        ``step``, ``before`` or ``after`` the update (:mod:`auditor.capture.params`)."""
        from auditor.capture.params import params_digest

        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {when!r}")
        digest, tensors, sampled = params_digest(model)
        self._write({"kind": "params", "pid": self.pid, "rank": self.rank, "role": self.role,
                     "host": self.host, "seq": None, "step": step, "when": when,
                     "in_phase": phase, "digest": digest, "tensors": tensors,
                     "sampled_bytes": sampled, "recorded_ns": time.time_ns()})

    def terminal(self, step: int) -> None:
        """Record that this rank finished its last step, ``step`` (contract v1.2): one record
        ``{"kind": "terminal", "step": N, ...}``, written and fsynced before this returns, so
        the proof of the last step survives whatever a log forwarder drops (seed 002's
        driver lost its ``step:N`` line to ``ray.shutdown()``; the rank's own record stays)."""
        if type(step) is not int or step < 0:
            raise ValueError(f"step must be a whole number >= 0, not {step!r}")
        self._write({"kind": "terminal", "pid": self.pid, "rank": self.rank, "role": self.role,
                     "host": self.host, "seq": None, "step": step,
                     "recorded_ns": time.time_ns()})
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def sample(self) -> None:
        """Write one memory sample (no ``phase``): allocated, reserved and device-used bytes
        now (null when not measured)."""
        allocated, reserved, used = self.memory.current()
        self._write({"pid": self.pid, "seq": None, "sample_ns": time.time_ns(),
                     "allocated_bytes": allocated, "reserved_bytes": reserved,
                     "device_used_bytes": used})

    def start_sampler(self, every: float) -> None:
        """Take a sample every ``every`` seconds in a daemon thread until :meth:`close`."""
        if every <= 0:
            raise ValueError(f"sample interval must be positive, not {every}")
        if self._sampler is not None:
            return
        self._sampler = threading.Thread(target=self._sample_loop, args=(every,),
                                         name="auditor-trace-sampler", daemon=True)
        self._sampler.start()

    def _sample_loop(self, every: float) -> None:
        while not self._stop.wait(every):
            with contextlib.suppress(OSError, ValueError):  # (closed under it: stop quietly)
                self.sample()

    def close(self) -> None:
        """Stop the sampler, fsync and close the file (idempotent)."""
        self._stop.set()
        if self._sampler is not None and self._sampler is not threading.current_thread():
            self._sampler.join()
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None

    def _write(self, record: dict[str, Any]) -> None:
        """Give ``record`` the next ``seq`` and append it as one whole line."""
        if os.getpid() != self.pid:
            raise RuntimeError(f"this Trace belongs to pid {self.pid}; a forked process "
                               "makes its own (the file is named by its pid)")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path}: trace is closed")
            record["seq"] = self._seq
            self._seq += 1
            # (an error message holding a file name's bytes is written printable: never
            # the record lost and the caller's error replaced)
            line = (json_line(record, separators=(",", ":")) + "\n").encode("utf-8")
            written = os.write(self._fd, line)
            # a regular file takes the whole line in one write; a short write (disk full)
            # leaves a partial last line, which the audit names, rather than a lost tail
            view = memoryview(line)[written:]
            while view:
                view = view[os.write(self._fd, view):]

    def _phase_record(self, name: str, step: int, started_ns: int,
                      error: BaseException | None) -> None:
        allocated, reserved = self.memory.peaks()
        if allocated is not None:
            self.peak_allocated_bytes = max(self.peak_allocated_bytes or 0, allocated)
        if reserved is not None:
            self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, reserved)
        record: dict[str, Any] = {
            "pid": self.pid, "rank": self.rank, "role": self.role, "host": self.host,
            "seq": None, "phase": name, "step": step, "started_ns": started_ns,
            "finished_ns": time.time_ns(),
            "error_type": "" if error is None else qualified_name(error),
        }
        if error is not None:
            record["error_message"] = str(error)[:2000]
        record["peak_allocated_bytes"] = allocated
        record["peak_reserved_bytes"] = reserved
        self._write(record)


class _Phase(contextlib.ContextDecorator):
    """One phase: ``with trace.phase("rollout_init"):`` or ``@trace.phase("actor_update", 1)``
    (a decorated function writes one record per call)."""

    def __init__(self, trace: Trace, name: str, step: int, params: Any = None) -> None:
        self.trace = trace
        self.name = name
        self.step = step
        self.params = params
        self._started: list[int] = []  # a stack: a decorated function may recurse

    def __enter__(self) -> _Phase:
        if self.params is not None:
            self.trace.params(self.params, self.step, "before", self.name)
        self.trace.memory.reset_peaks()
        self._started.append(time.time_ns())
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: object) -> None:
        # returns None: the exception, if any, goes on unchanged
        self.trace._phase_record(self.name, self.step, self._started.pop(), error)
        if self.params is not None and error is None:  # (a failed update has no "after")
            self.trace.params(self.params, self.step, "after", self.name)


def trace_path(attempt_dir: Path, pid: int, host: str | None = None) -> Path:
    """Where the trace of ``pid`` on ``host`` (default: this node) lives under
    ``attempt_dir``."""
    return attempt_dir / ALLOCATOR_TRACE.path_for(host=host or hostname(), pid=pid)
