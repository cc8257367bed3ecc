"""One output written by a forked copy of this process while this process writes the others.

A many-period study's writing ran on one core while the others idled: at 4,000 periods
``diagnostic.md`` took 0.5 s of its 1.4 s, ``evidence.md`` 0.4. A :class:`Beside` forks
once the report can be written (it needs the other outputs' names, not their bytes); the
child has the whole result (its pages shared with the parent, not copied), writes its one
file and sends back what it reports of it (the file's hash and size); the parent writes the
tables, the summary and ``evidence.md`` meanwhile and takes that report when it needs it.
Whatever goes wrong in the child (an exception, a signal, no fork at all),
:meth:`Beside.result` is None and the caller writes the file itself: a helper changes when a
file is written, never what it holds.

Only the command asks for one (``write_outputs(helper=True)``), from its own process: a
library caller (a notebook's kernel, say) is never forked. The child touches none of the
parent's threads' locks: its streams are its own, and it ends with ``os._exit``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Callable

from auditor._signals import helper_args, helper_context, helper_signals, signals_deferred

MESSAGE_LIMIT = 4096
"""The most bytes of a child's report read back (a hash and a size need far fewer)."""


class Beside:
    """``work()`` run in a forked child, started as the block is entered; :meth:`result`
    gives the string it returned, or None when it gave none. A child still running when
    the block ends (the parent failed, or was interrupted, even as it forked) is killed
    and reaped, so it never writes on into a staging directory that is being removed."""

    def __init__(self, work: Callable[[], str]) -> None:
        self._work = work
        self._pid: int | None = None
        self._read: int | None = None

    def __enter__(self) -> Beside:
        try:
            self._start()
        except OSError:  # (no pipe or no process to spare: the caller writes the file)
            self._reap(kill=True)
        except BaseException:  # (a signal held through the fork is raised as it ends)
            self._reap(kill=True)
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self._reap(kill=True)

    def _start(self) -> None:
        with signals_deferred(), warnings.catch_warnings():
            # (born with SIGINT and SIGTERM held, and their handlers the parent's recorders:
            # the child sets its own before it lets them in. Python 3.12 warns of a fork
            # beside threads: a test's process has them; the command asks only from its
            # own, which has none)
            warnings.simplefilter("ignore", DeprecationWarning)
            lifeline = helper_args(helper_context())[0]  # (the readers' own, on Linux)
            self._read, write = os.pipe()
            try:
                self._pid = os.fork()
                if self._pid == 0:  # pragma: no cover - the child (its work is covered too)
                    _child(self._work, lifeline, self._read, write)
            finally:
                os.close(write)

    def result(self) -> str | None:
        """What the child's work returned (waiting for it to end); None when it failed, was
        killed, never started or could not be waited for. Called once."""
        if self._pid is None or self._read is None:
            return None
        message = b""
        with contextlib.suppress(OSError):
            while len(message) <= MESSAGE_LIMIT and (part := os.read(self._read, 1024)):
                message += part
        status = self._reap(kill=False)
        if status != 0 or not message or len(message) > MESSAGE_LIMIT:
            return None
        try:
            return message.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _reap(self, kill: bool) -> int | None:
        """End the child (killed first when ``kill``) and its pipe; its exit status (None
        when there was none, or it cannot be known)."""
        with signals_deferred():  # (never cut short: a child left is a writer left running)
            pid, self._pid = self._pid, None
            if self._read is not None:
                os.close(self._read)
                self._read = None
            if pid is None:
                return None
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:  # (SIGCHLD ignored, as a launcher may leave it: the
                return None  # system reaped it, and its exit status is not known)
            return os.waitstatus_to_exitcode(status)


def _child(work: Callable[[], str], lifeline: int, read: int, write: int
           ) -> None:  # pragma: no cover - the child
    """Run ``work`` and send its result; never return (``os._exit``: the parent's exit
    hooks, buffers and pools are the parent's, and its code after the fork is not run)."""
    code = 1
    try:
        os.close(read)
        # as the readers do: ^C and SIGTERM are the parent's to answer (it ends this child),
        # and a parent killed outright (SIGKILL) ends it too, as its lifeline closes
        helper_signals(lifeline)
        # streams of its own: another thread of the parent (a progress bar's) may have held
        # a stream's lock as it forked, and nothing of the child's is to be seen anyway
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - till os._exit
        data = work().encode("utf-8")
        while data:
            data = data[os.write(write, data):]
        code = 0
    except BaseException:  # noqa: BLE001, S110 - the parent writes the file itself
        pass
    finally:
        os._exit(code)
