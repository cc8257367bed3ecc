"""Supervising a wrapped command: its output teed, signals forwarded to all of it, nothing of
it left behind.

Both forms of ``auditor run`` start the command in a process group of its own and make the
wrapper a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a descendant that left
the command's group or session (torchrun's elastic agent starts each rank with a session of
its own) and lost its parent is re-parented to the wrapper rather than to init, so the
wrapper still finds it (``/proc``), signals it and reaps it.

- A trapped SIGTERM or SIGINT is forwarded to the command's group and to every descendant
  outside it, and starts the grace: everything still there ``grace_s`` later is SIGKILLed.
- SIGUSR1 (Slurm's pre-timeout warning, ``--signal=B:SIGUSR1@N``) is recorded and forwarded
  the same way and starts no timer: the trainer may checkpoint until the scheduler's own
  SIGTERM (contract v1.2, "Signals").
- Once the command itself exited, whatever is left of its descendants (in its group or not)
  is sent SIGTERM, then SIGKILL ``drain_s`` later, and reaped; each is recorded
  (:attr:`Supervision.outlived`), and so is every process group one of them was seen in (a
  descendant that keeps forking outruns any look at ``/proc``, never its group's signal); the
  SIGKILL is repeated until nothing is left, and the wrapper's own children (every orphan of
  the command's: one that takes a new session at every fork, so a new group, too) are read
  from the kernel's list and SIGKILLed faster than such a one forks. The output pipe is read
  meanwhile; a process that holds it open outside the wrapper's reach (another user's, say)
  stops the reading after ``drain_s``.
- The wrapper's own lines in the log (``[auditor run] ...``) wait while a line of the
  command's is unfinished: one written there would split it (a terminal line among them).

Only processes descended from the command are ever signalled: the wrapper's other children
(a library caller's) are left alone.

Nothing outlives a killed wrapper either (a SIGKILL runs no handler of the wrapper's): the
command gets ``PR_SET_PDEATHSIG`` (SIGKILL when the wrapper dies), and a *guardian* started
beside it (:mod:`auditor.capture.guardian`, a few lines of Python in a session of its own
that ignore the termination signals a group or a terminal sends: HUP, INT, QUIT, USR1, USR2,
PIPE, TERM) waits on a pipe whose other end only the wrapper holds. When the pipe closes
without the wrapper's "done" (the wrapper died), the guardian SIGKILLs the command's process
group and every process that carries this run's :data:`RUN_TOKEN` in its environment (what
left the group or the session: torchrun's ranks, a daemonised helper), every process of the
command's the wrapper's looks found (told by pid and start time: a helper started with an
environment of its own) and their children, until none is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from auditor.capture.guardian import RUN_TOKEN, start_guardian

NOTE = b"[auditor run] "
SEEN_EVERY_S = 1.0
GRACE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""The signals the grace counts from (SIGUSR1 is a warning, never a reason to kill)."""
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PR_SET_PDEATHSIG = 1



def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


def become_subreaper() -> int | None:
    """Make this process a child subreaper; returns the setting it had (None where the
    kernel has none: not Linux, or older than 3.4)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "prctl"):
        return None
    previous = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
        return None
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return None
    return previous.value


def restore_subreaper(previous: int | None) -> None:
    """Put back the setting :func:`become_subreaper` returned."""
    libc = _libc()
    if previous is not None and libc is not None:
        libc.prctl(PR_SET_CHILD_SUBREAPER, previous, 0, 0, 0)


def _processes() -> dict[int, tuple[int, str, int, int]]:
    """Every live process: pid -> (parent pid, state letter, process group, session), from
    ``/proc/<pid>/stat``."""
    found: dict[int, tuple[int, str, int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    # (newest first: a process that keeps forking is read while it is still there, and its
    # group is then known)
    for name in sorted((name for name in names if name.isdigit()), key=int, reverse=True):
        fields = _stat(int(name))  # (None: gone meanwhile)
        if fields is not None and len(fields) >= 4 \
                and all(field.isdigit() for field in fields[1:4]):
            found[int(name)] = (int(fields[1]), fields[0].decode("ascii", "replace"),
                                int(fields[2]), int(fields[3]))
    return found


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (the state first, then
    the parent, group, session...; the name may hold spaces and parentheses); None where the
    process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15; ``signal 77`` for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _killpg(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@dataclass
class Supervision:
    """What the wait loop and the signal handler share about one wrapped command."""

    grace_s: float
    pgid: int = 0
    """The command's pid and process group (0 until it started)."""
    others: frozenset[int] = frozenset()
    """The wrapper's children before the command started (never the command's)."""
    signals: list[str] = field(default_factory=list)
    kill_at: float | None = None
    killed_after_grace: bool = False
    notes: list[bytes] = field(default_factory=list)
    """The wrapper's lines for the log not yet written: held while a line of the command's
    is unfinished (:func:`flush_notes`)."""
    mid_line: bool = False
    """Whether the command's output in the log ends inside a line (no newline or carriage
    return yet)."""
    output_over: bool = False
    """Whether the command's output is no longer copied (its notes then wait for nothing)."""
    lost: int = 0
    """Bytes of the command's output and of the wrapper's notes the log could not take (a
    full disk, a quota): dropped and counted, never the end of a healthy run (:func:`_put`)."""
    lost_why: str | None = None
    """Why the first of them was lost (``No space left on device``)."""
    removed: bool = False
    """Whether the file the output went to was removed while the command ran (its lines are
    gone: the record says so)."""
    outlived: dict[int, str] = field(default_factory=dict)
    """Each descendant that outlived the command: pid -> the last signal it was sent."""
    guardian: subprocess.Popen[bytes] | None = None
    """The process that ends the command if the wrapper dies (see the module docstring)."""
    token: str = ""
    """This run's :data:`RUN_TOKEN` value, in the command's environment."""
    ended_by: str | None = None
    """The signal that ended the command itself (``SIGTERM``), when one did."""
    seen: set[int] = field(default_factory=set)
    """Every pid of the command's tree seen while it ran (looked at every
    :data:`SEEN_EVERY_S`): whose framework sessions are this run's (Ray names its session for
    the process that started it)."""
    groups: set[int] = field(default_factory=set)
    """The process groups the command's descendants were seen in, while each has a member
    (an emptied one is let go at the next look): a descendant that keeps forking can be
    missed by every look at ``/proc`` (each fork a new pid), never by its group's signal
    (:meth:`live_groups`)."""

    def tree(self) -> list[int]:
        """The command's live descendants (its own process excluded once it is gone): its
        children's subtrees, and those of orphans re-parented to the wrapper."""
        if self.pgid <= 0:
            return []
        table = _processes()
        me = os.getpid()
        children: dict[int, list[int]] = {}
        for pid, (parent, *_) in table.items():
            children.setdefault(parent, []).append(pid)
        roots = [self.pgid] if self.pgid in table else []
        roots += [pid for pid in children.get(me, ()) if pid != self.pgid
                  and pid not in self.others and self.ours(pid)]
        found: list[int] = []
        stack = list(roots)
        while stack:
            pid = stack.pop()
            if pid in found:
                continue
            found.append(pid)
            stack.extend(children.get(pid, ()))
        live = [pid for pid in found if table[pid][1] != "Z"]
        # (a group is the command's when it is the command's own, when a descendant made it
        # (its number is a descendant's pid), or when its session is one a descendant made:
        # never a group of the wrapper's session that a descendant joined)
        session = os.getsid(0)
        self.groups.update(
            table[pid][2] for pid in live
            if table[pid][2] == self.pgid or table[pid][2] in found
            or table[pid][2] in self.seen or table[pid][3] != session)
        self.live_groups()  # (let go of the emptied ones now: see live_groups)
        return [pid for pid in live if pid != self.pgid]

    def live_groups(self) -> list[int]:
        """The process groups a descendant of the command was seen in that still have a
        member (never the wrapper's own group), each emptied one let go: safe to signal, as
        a group's number is never taken again while any process is in it, and one let go as
        soon as a look finds it empty (looks come at least every :data:`SEEN_EVERY_S` while
        the command runs) is never signalled after its number could be reused."""
        own = os.getpgrp()
        live = []
        for group in sorted(self.groups):  # (a copy: the signal handler may add one)
            if group != own and _killpg(group, 0):
                live.append(group)
            else:
                self.groups.discard(group)
        return live

    def signal_all(self, signum: int) -> int:
        """Send ``signum`` to the command's group and every descendant outside it; returns
        how many processes outside the group it reached."""
        if self.pgid > 0:
            _killpg(self.pgid, signum)
        reached = 0
        for pid in self.tree():
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == self.pgid:
                    continue  # (the group's signal reached it)
            reached += _kill(pid, signum)
        return reached

    def on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        self.signals.append(name)
        grace = signum in GRACE_SIGNALS
        if grace and self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace_s
        if self.pgid <= 0:
            self.notes.append(NOTE + f"received {name} before the command started".encode()
                              + b"\n")
            return
        alive = _killpg(self.pgid, 0) or bool(self.tree())
        self.signal_all(signum)
        then = f"; SIGKILL after {self.grace_s:g} s" if grace and self.kill_at is not None \
            else "; no kill timer (a warning: the command may checkpoint)"
        self.notes.append(NOTE + (f"received {name}; forwarded to process group {self.pgid} "
                                  f"and its descendants{then}" if alive else
                                  f"received {name}; process group {self.pgid} already gone"
                                  ).encode() + b"\n")

    def ours(self, pid: int) -> bool:
        """Whether the wrapper's child ``pid`` (not the command itself) is the command's:
        an orphan of it re-parented to the subreaper, seen by a look, in the command's
        process group or one of its descendants' (or a session of their own), or carrying
        this run's :data:`RUN_TOKEN`; never a child a library caller started meanwhile in
        the wrapper's own group and session (one that ended is the caller's to reap)."""
        if pid in self.seen or pid in self.outlived:
            return True
        fields = _stat(pid)
        if fields is None or len(fields) < 4 or not fields[2].isdigit() \
                or not fields[3].isdigit():
            return False  # (gone)
        group, session = int(fields[2]), int(fields[3])
        if group == self.pgid or group in self.groups or session != os.getsid(0):
            return True
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                return f"{RUN_TOKEN}={self.token}".encode() in handle.read().split(b"\0")
        except OSError:
            return False

    def reap(self) -> None:
        """Collect the exit of every orphan of the command's re-parented to the wrapper that
        ended (a zombie otherwise: the wrapper is their parent now); a library caller's own
        child is its own to reap."""
        me = os.getpid()
        for pid, (parent, *_) in _processes().items():
            if parent == me and pid != self.pgid and pid not in self.others \
                    and self.ours(pid):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)


def start(command: Iterable[str], env: dict[str, str], state: Supervision
          ) -> subprocess.Popen[bytes]:
    """Start the command in a process group of its own, its output on one pipe, and its
    guardian (raises ``OSError`` when it cannot start; the guardian is then let go)."""
    token = f"{os.getpid()}-{time.time_ns()}-{os.urandom(4).hex()}"
    state.token = token
    state.guardian = start_guardian(token)
    state.others = frozenset(pid for pid, (parent, *_) in _processes().items()
                             if parent == os.getpid())
    try:
        process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env={**env, RUN_TOKEN: token}, process_group=0,
                                   preexec_fn=_dies_with(os.getpid()))
    except BaseException:
        release(state)
        raise
    _tell(state, f"{process.pid}\n")
    state.pgid = process.pid
    if state.signals:  # (trapped while the command was being started: it gets it now)
        state.signal_all(signal.Signals[state.signals[0]])
    return process


def _dies_with(parent: int) -> Callable[[], None]:
    """The command's first act in its own process: be SIGKILLed when the wrapper dies (and
    end at once if it died already, before the request was made)."""
    libc = _libc()
    prctl = getattr(libc, "prctl", None)

    def request() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)
    return request


def _see(state: Supervision, pids: list[int]) -> None:
    """Keep the command's processes a look found, and tell the guardian each new one with
    its start time: a process that left the command's group and session and runs with an
    environment of its own (no :data:`RUN_TOKEN`) is known to it so, should the wrapper be
    killed (a pid reused since has another start time)."""
    for pid in pids:
        if pid in state.seen:
            continue
        state.seen.add(pid)
        fields = _stat(pid)
        if fields is not None and len(fields) > 19 and fields[19].isdigit():
            _tell(state, f"{pid} {fields[19].decode()}\n")


def _tell(state: Supervision, text: str) -> None:
    guardian = state.guardian
    if guardian is not None and guardian.stdin is not None:
        with contextlib.suppress(OSError):
            guardian.stdin.write(text.encode())
            guardian.stdin.flush()


def release(state: Supervision) -> None:
    """Tell the guardian the command is over and the wrapper alive: it ends, touching
    nothing."""
    guardian, state.guardian = state.guardian, None
    if guardian is None:
        return
    with contextlib.suppress(OSError):
        if guardian.stdin is not None:
            guardian.stdin.write(b"done\n")
            guardian.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        guardian.wait(timeout=5)


HELD_AFTER_S = 0.5
"""How long what the command's pipe still holds as it exits is read before the pipe counts as
held open by something else (a straggler that writes on)."""


def wait(process: subprocess.Popen[bytes], state: Supervision, log_fd: int,
         echo_fd: int | None, drain_s: float) -> bool:
    """Copy the command's output until it exited and nothing of it is left (SIGTERM, then
    SIGKILL ``drain_s`` later, to what outlived it); SIGKILL everything once the grace after
    a SIGTERM or SIGINT ran out. Returns whether the output pipe was still held open when
    the command exited."""
    held = _wait(process, state, log_fd, echo_fd, drain_s)
    release(state)  # (only now: should the waiting fail, the guardian ends what is left)
    return held


def _wait(process: subprocess.Popen[bytes], state: Supervision, log_fd: int,
          echo_fd: int | None, drain_s: float) -> bool:
    assert process.stdout is not None
    pipe = process.stdout.fileno()
    os.set_blocking(pipe, False)
    selector = selectors.DefaultSelector()
    selector.register(pipe, selectors.EVENT_READ)
    reading, drain_until, held = True, None, False
    _see(state, [process.pid])
    looked = 0.0
    try:
        while True:
            flush_notes(state, log_fd)
            if reading:
                for _ in selector.select(timeout=0.1):
                    reading, echo_fd = _copy(state, pipe, log_fd, echo_fd)
                if not reading:
                    selector.unregister(pipe)
                    state.output_over = True  # (no line of the command's is left to end)
            else:
                time.sleep(0.05)
            now = time.monotonic()
            if process.poll() is None:
                if now - looked >= SEEN_EVERY_S:
                    _see(state, state.tree())
                    looked = now
                if state.kill_at is not None and now >= state.kill_at \
                        and not state.killed_after_grace:
                    state.signal_all(signal.SIGKILL)
                    state.killed_after_grace = True
                    note(state, log_fd, f"grace over: SIGKILL to process group {state.pgid} and "
                                 "its descendants")
                continue
            state.reap()
            left = _with_orphans(state, state.tree())
            groups = state.live_groups()  # (members no look found: Supervision.groups)
            if drain_until is None:
                # (what the command wrote before it exited is read first: a pipe that still
                # holds it is not one held open; a straggler writing on is, after a while)
                until = now + HELD_AFTER_S
                while reading and selector.select(timeout=0) and time.monotonic() < until:
                    reading, echo_fd = _copy(state, pipe, log_fd, echo_fd)
                    if not reading:
                        selector.unregister(pipe)
                        state.output_over = True
                held = reading
                drain_until = now + drain_s
                if left or groups:
                    _end(state, left, signal.SIGTERM, log_fd,
                         (f"{len(left)} of the command's processes" if left else
                          "processes of the command's that no look found")
                         + f" outlived it ({_pids(left, groups)}): SIGTERM, SIGKILL after "
                           f"{drain_s:g} s")
            if not reading and not left and not groups:
                return held
            if now >= drain_until:
                if left or groups:
                    _end(state, left, signal.SIGKILL, log_fd,
                         f"still there {drain_s:g} s after the command exited "
                         f"({_pids(left, groups)}): SIGKILL")
                    _settle(state)
                elif reading:
                    note(state, log_fd, f"output pipe still open {drain_s:g} s after the command "
                                 "exited, held by no process of the command's; reading stops")
                return held
    finally:
        selector.close()
        process.stdout.close()
        state.output_over = True  # (what notes wait for now is written as they come)
        flush_notes(state, log_fd)


def _end(state: Supervision, pids: list[int], signum: int, log_fd: int, text: str) -> None:
    for pid in pids:
        if pid > 0 and _kill(pid, signum):
            state.outlived[pid] = signal.Signals(signum).name
    for group in state.live_groups():
        _killpg(group, signum)
    note(state, log_fd, text)


def _settle(state: Supervision, timeout: float = 2.0) -> None:
    """Wait (briefly) until every SIGKILLed descendant is gone and reaped, SIGKILLing what
    each look finds: a descendant that forked between a look at ``/proc`` and its SIGKILL
    left a child the look missed (one that keeps forking moves to a new pid every few
    milliseconds), and each SIGKILLed one forks no more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _sweep(state, deadline)
        state.reap()
        left = _with_orphans(state, state.tree())
        groups = state.live_groups()
        if not left and not groups:
            return
        for pid in left:
            if _kill(pid, signal.SIGKILL):
                state.outlived[pid] = "SIGKILL"
        for group in groups:
            _killpg(group, signal.SIGKILL)
        time.sleep(0.01)


def _own_children() -> list[int]:
    """This process's children, from the kernel's own lists of each of its threads
    (``/proc/self/task/*/children``; none where the kernel keeps no such list)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, ValueError):
                with open(f"/proc/self/task/{task}/children", "rb") as handle:
                    found += [int(pid) for pid in handle.read().split()]
    return found


def _with_orphans(state: Supervision, pids: list[int]) -> list[int]:
    """``pids`` (a look over ``/proc``) and the wrapper's own children of the command's: a
    look misses a descendant that forked after its listing (one that hops to a new pid
    and a new session at every fork is never in it), never the kernel's list of children."""
    orphans = [pid for pid in _own_children() if pid != state.pgid and pid not in state.others
               and pid not in pids and _running(pid) and state.ours(pid)]
    return [*pids, *orphans]


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie waiting to be reaped, nor gone)."""
    fields = _stat(pid)
    return fields is not None and fields[:1] != [b"Z"] and bool(fields)


def _sweep(state: Supervision, deadline: float) -> None:
    """SIGKILL and reap the wrapper's own children of the command's (orphans re-parented to
    the subreaper) until none is left. A descendant that moves to a new pid and a new session
    at every fork escapes both a look over ``/proc`` (slower than its hop) and every group's
    signal (each pid a group of its own), but each pid it leaves is the wrapper's child as
    soon as its parent is gone: read from the kernel's list, a few microseconds, the next one
    is SIGKILLed before it forks again (a SIGKILLed process forks no more)."""
    while time.monotonic() < deadline:
        found = False
        for pid in _own_children():
            if pid == state.pgid or pid in state.others or not state.ours(pid):
                continue
            found = True
            with contextlib.suppress(ChildProcessError, OSError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    continue  # (it had ended: reaped)
            if _kill(pid, signal.SIGKILL):
                state.outlived[pid] = "SIGKILL"
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        if not found:
            return


def _pids(pids: list[int], groups: list[int]) -> str:
    """``pids 1, 2``, and the process groups signalled with them (``process groups 7``)."""
    shown = ", ".join(str(pid) for pid in sorted(pids)[:8])
    said = [f"pids {shown}" + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")] \
        if pids else []
    if groups:
        said.append("process group" + ("s " if len(groups) > 1 else " ")
                    + ", ".join(str(group) for group in groups))
    return "; ".join(said)


def note(state: Supervision, log_fd: int, text: str) -> None:
    """A line of the wrapper's own in the command's log (as soon as no line of the
    command's is left unfinished: :func:`flush_notes`)."""
    state.notes.append(NOTE + text.encode("utf-8", "replace") + b"\n")
    flush_notes(state, log_fd)


def flush_notes(state: Supervision, log_fd: int) -> None:
    """Write the notes waiting (the signal handler's too), unless the command's output is
    inside a line: a note written there would split the command's line in two (a terminal
    event among them); they wait for its end, or for the end of the output, after which an
    unfinished last line is ended first."""
    if not state.notes or (state.mid_line and not state.output_over):
        return
    if state.mid_line:
        _put(state, log_fd, b"\n")
        state.mid_line = False
    while state.notes:
        _put(state, log_fd, state.notes.pop(0))


def _put(state: Supervision, log_fd: int, data: bytes) -> None:
    """Write all of ``data`` to the log (a short write goes on from where it stopped); what
    the log cannot take (a full disk for a moment, a quota) is dropped and counted in
    :attr:`Supervision.lost`: the command runs on, and its record says what was lost."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(log_fd, view):]
        except InterruptedError:
            continue
        except OSError as error:
            state.lost += len(view)
            state.lost_why = state.lost_why or error.strerror or str(error)
            return


def _log_output(state: Supervision, log_fd: int, data: bytes) -> None:
    """Write ``data`` of the command's to the log, and the notes waiting where its last
    line in ``data`` ends (a carriage return ends a progress bar's piece)."""
    if state.notes:
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if cut or not state.mid_line:
            if cut:
                _put(state, log_fd, data[:cut])
            state.mid_line = False
            flush_notes(state, log_fd)
            data = data[cut:]
    if data:
        _put(state, log_fd, data)
        state.mid_line = data[-1:] not in (b"\n", b"\r")


def _copy(state: Supervision, pipe: int, log_fd: int, echo_fd: int | None
          ) -> tuple[bool, int | None]:
    """Copy what the pipe holds; returns (still open, the echo descriptor or None once it
    failed: a closed stdout does not stop the log)."""
    try:
        data = os.read(pipe, 1 << 16)
    except BlockingIOError:
        return True, echo_fd
    if not data:
        return False, echo_fd
    _log_output(state, log_fd, data)
    return True, (_echo(echo_fd, data) if echo_fd is not None else None)


ECHO_PIECE = 4096
"""Bytes echoed at a time: a pipe that says it can be written takes this many at once."""
ECHO_WAIT_S = 0.1
"""The longest the echo waits for this process's stdout to take a piece before it gives up
echoing (a pipe whose reader stopped, a stopped terminal): the log has everything."""


def _echo(echo_fd: int, data: bytes) -> int | None:
    """Echo ``data`` to this process's stdout, never waiting on it for long: a write that
    waited would stop the wrapper's clock, and with it the grace after a SIGTERM. None once
    the stdout failed (closed) or took nothing for :data:`ECHO_WAIT_S`: from then on only
    the log has the output, as with a closed stdout."""
    view = memoryview(data)
    ready = select.poll()  # (not select.select: it refuses a descriptor past 1023)
    ready.register(echo_fd, select.POLLOUT)
    try:
        while view:
            if not ready.poll(ECHO_WAIT_S * 1000):
                return None
            view = view[os.write(echo_fd, view[:ECHO_PIECE]):]
    except OSError:  # (a closed or broken stdout: the write says so)
        return None
    return echo_fd
