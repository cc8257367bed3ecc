"""Signals, for the command's process and the helper processes it starts.

The audit's readers and the plot helper are children of the command's process
and share its process group: a Ctrl-C at the terminal reaches them all, and so
does a cancelled job's SIGTERM. The command itself answers both (it removes a
half-written output and exits 130); a helper must neither print a traceback nor
die in a way that leaves the command waiting for it. Helpers are therefore
started inside :func:`signals_deferred` (they are born with both signals held)
and begin with :func:`helper_signals` (they ignore both).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing.context import BaseContext

HELD = frozenset({signal.SIGINT, signal.SIGTERM})
_PR_SET_PDEATHSIG = 1


def helper_context() -> BaseContext:
    """How helpers are started: forked on Linux (at once, a copy of the command, whose
    death the helper can then follow), as the platform does by default elsewhere."""
    return multiprocessing.get_context("fork" if sys.platform == "linux" else None)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM and SIGINT for the block: they are delivered when it ends. A cleanup
    in the block cannot be cut short by a second signal, and a process started in it is
    born with both held."""
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    except (AttributeError, OSError, ValueError):  # not the main thread, or no such call
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def helper_signals(command: int) -> None:
    """First thing in a helper process started by process ``command`` (a pool's
    ``initializer``, with ``initargs=(os.getpid(),)``): ignore SIGINT and SIGTERM, then
    take the signals held since it was started.

    The command, which gets them too, ends its helpers in order: each finishes the task
    in hand and exits. A helper must not die on its own: one killed while it sends a
    result leaves half a message in the pipe, and the pool waits for the rest for ever;
    nor may it run the command's handler (inherited by a forked helper), which raises
    KeyboardInterrupt inside the pool's machinery and prints a traceback. A helper whose
    command is killed outright (SIGKILL) is killed with it, on Linux: nothing else would
    end it (its task queue stays open in its siblings)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with(command)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def _die_with(command: int) -> None:
    """Ask Linux to SIGKILL this helper, forked by ``command``, when that process ends."""
    if sys.platform != "linux" or os.getpid() == command:
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (AttributeError, OSError):
        return
    if os.getppid() != command:  # the command ended before the request took effect
        os._exit(0)
