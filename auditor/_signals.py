"""Signals, for the command's process and the helper processes it starts.

The audit's readers and the plot helper are children of the command's process
and share its process group: a Ctrl-C at the terminal reaches them all, and so
does a cancelled job's SIGTERM. The command itself answers both (it removes a
half-written output and exits 130); a helper must neither print a traceback nor
die in a way that leaves the command waiting for it. Helpers are therefore
started inside :func:`signals_deferred` (they are born with both signals held)
and begin with :func:`helper_signals` (they ignore both, and end when the
command's process is gone).

The process's memory (the garbage collector, the C heap) is :mod:`auditor.store.heap`'s.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing.context import BaseContext
from types import FrameType
from typing import Any

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that end a command as Ctrl-C does (SIGHUP: its terminal closed)."""
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
    for number in HELD:
        signal.signal(number, signal.SIG_IGN)
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


def _interrupt_main_soon() -> None:
    import _thread
    import time

    time.sleep(0.05)
    # (as SIGTERM: its handler is the command's own, which a shell's '&' leaves in place
    # where it sets SIGINT to be ignored; ignored too once the process only exits)
    _thread.interrupt_main(signal.SIGTERM)


def interrupt_unraised(unraisable: Any) -> None:
    """``sys.unraisablehook`` of the command's process (whose SIGTERM handler raises
    KeyboardInterrupt): a Ctrl-C or SIGTERM that landed in a
    finalizer (a ``weakref.finalize`` callback, a ``__del__``) is raised again in the main
    thread, where it unwinds as any other, never printed as a traceback and dropped (the
    audit then ran on, its 'Exception ignored' on stderr); anything else as Python says it."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        import _thread

        # (from another thread, once this hook has returned: raised in it, it would be
        # dropped again)
        _thread.start_new_thread(_interrupt_main_soon, ())
        return
    sys.__unraisablehook__(unraisable)
