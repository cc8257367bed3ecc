"""Signals, for the command's process and the helper processes it starts.

The audit's readers and the plot helper are children of the command's process
and share its process group: a Ctrl-C at the terminal reaches them all, and so
does a cancelled job's SIGTERM. The command itself answers both (it removes a
half-written output and exits 130); a helper must neither print a traceback nor
die in a way that leaves the command waiting for it. Helpers are therefore
started inside :func:`signals_deferred` (they are born with both signals held)
and begin with :func:`helper_signals` (they ignore both, and end when the
command's process is gone).

:func:`paused_gc` is the other process-wide state the audit and the report set: the cyclic
garbage collector, paused while they build and write a result; and the C heap's (glibc's):
:func:`lean_heap` for the command's process as it writes, :func:`release_free_memory` between
outputs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing.context import BaseContext
from types import FrameType
from typing import Any

HELD = (signal.SIGINT, signal.SIGTERM)
_lifeline: tuple[int, int, int] | None = None
"""(process id, read end, write end) of the pipe whose end tells helpers their command
is gone; made when a process first starts helpers (the write end is -1 in a process
forked from it)."""


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM and SIGINT for the block: what arrives meanwhile takes effect when it
    ends. A cleanup in the block cannot be cut short by a signal, and a process started
    in it is born with both blocked.

    Blocking is per thread, and another thread (a progress bar's, pyarrow's) may take
    the signal; Python would then still run the handler in this thread, mid-block. In
    the main thread the handlers are therefore also swapped for recorders, and a
    recorded signal is raised again once the block is over. Putting the handlers back
    can itself be cut short by one of them (two signals at once): a recorder left in
    place then passes every signal on to its handler, and the next block puts that
    handler back."""
    caught: list[int] = []
    recording = [True]
    swapped: dict[signal.Signals, Any] = {}
    previous = None
    try:
        if threading.current_thread() is threading.main_thread():
            for held in HELD:
                handler = signal.getsignal(held)
                handler = getattr(handler, "auditor_passes_to", handler)  # a left recorder
                if callable(handler):  # (SIG_IGN and SIG_DFL need no recorder)
                    swapped[held] = handler
                    signal.signal(held, _recorder(handler, caught, recording))
        with contextlib.suppress(AttributeError, OSError, ValueError):  # no such call
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
        yield
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # (held ones: recorded)
        recording[0] = False
        for held, handler in swapped.items():
            signal.signal(held, handler)
        if caught:
            signal.raise_signal(caught[0])


def _recorder(handler: Any, caught: list[int], recording: list[bool]) -> Any:
    """A signal handler that records the signal while ``recording[0]``, and afterwards
    passes it on to ``handler``."""
    def record(number: int, frame: FrameType | None) -> None:
        if recording[0]:
            caught.append(number)
        else:
            handler(number, frame)

    record.auditor_passes_to = handler  # type: ignore[attr-defined]
    return record


def helper_context() -> BaseContext:
    """How helpers are started: forked on Linux (at once, a copy of the command that can
    follow the command's end), as the platform does by default elsewhere."""
    return multiprocessing.get_context("fork" if sys.platform == "linux" else None)


def helper_args(context: BaseContext) -> tuple[int]:
    """The ``initargs`` of :func:`helper_signals` for a pool started with ``context``:
    the read end of the command's lifeline (a pipe only the command keeps open for
    writing: every process forked from it closes the write end at once), or ``-1``
    where helpers are not forked (they then cannot follow it)."""
    global _lifeline
    if context.get_start_method() != "fork":
        return (-1,)
    if _lifeline is None or _lifeline[0] != os.getpid():  # (a forked caller makes its own)
        read_end, write_end = os.pipe()
        _lifeline = (os.getpid(), read_end, write_end)
    return (_lifeline[1],)


def _leave_lifeline() -> None:
    """In every process forked from one with a lifeline: close its write end (the pipe
    must end with the process that made it, not with the last of its children)."""
    global _lifeline
    if _lifeline is not None and _lifeline[0] != os.getpid() and _lifeline[2] >= 0:
        with contextlib.suppress(OSError):
            os.close(_lifeline[2])
        _lifeline = (_lifeline[0], _lifeline[1], -1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_leave_lifeline)


def helper_signals(read_end: int) -> None:
    """First thing in a helper process (a pool's ``initializer``, with
    ``initargs=helper_args(context)``): ignore SIGINT and SIGTERM, follow the command's
    lifeline, then take the signals held since the helper was started.

    The command, which gets the signals too, ends its helpers in order: each finishes the
    task in hand and exits. A helper must not die on its own: one killed while it sends
    a result leaves half a message in the pipe, and the pool waits for the rest for ever;
    nor may it run the command's handler (inherited by a forked helper), which raises
    KeyboardInterrupt inside the pool's machinery and prints a traceback. A helper whose
    command is killed outright (SIGKILL) ends as the lifeline closes: nothing else would
    end it (its task queue stays open in its siblings)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if read_end >= 0:
        threading.Thread(target=_follow, args=(read_end,), daemon=True).start()
    with contextlib.suppress(AttributeError, OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def _follow(read_end: int) -> None:
    """In a helper: wait for the command's lifeline to close, then end at once."""
    with contextlib.suppress(OSError):
        while os.read(read_end, 1):
            pass
    os._exit(0)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block.

    An audit builds millions of small records that hold no reference cycles and
    live until the report is written; each collection re-scans them (about 10% of
    the time of a many-file study, measured with ``gc.callbacks``; writing the report
    of the 144,003-file study took 16-18 s with the collector on, 13.6 s paused) yet
    can free nothing. Reference counting still frees everything as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


MMAP_THRESHOLD = 128 * 1024
"""Bytes from which the C library's ``malloc`` maps a block of its own, given back to the
system when freed (glibc's default, held fixed: see :func:`lean_heap`)."""
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number of the threshold (``malloc.h``)."""


@functools.cache
def _glibc() -> Any:
    """The C library, when it is glibc (whose ``mallopt`` and ``malloc_trim`` are called
    below); None anywhere else."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        os.confstr("CS_GNU_LIBC_VERSION")  # (musl has no such name: ValueError)
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except (ValueError, OSError, ImportError):
        return None


def lean_heap() -> bool:
    """Have this process give every large freed block back to the system: hold glibc's
    mmap threshold at its default of 128 KiB (the command does, once its readers are gone,
    before it writes the outputs: a reader forked with it paid a mapping and its page
    faults for each block it read a file into, 5-15% of a many-file audit). glibc raises the
    threshold each time a mapped block is freed, up to 32 MiB, so after the first record
    batches and Arrow buffers come and go, blocks of that size are carved from the heap,
    and what they leave when freed is kept for the process's life: at a million files
    that was 70-160 MB of the audit's peak, free but never returned. Whether it was set
    (False off glibc)."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``): between
    the outputs of a large audit, what one freed is then not held while the next is
    written. Nothing off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
