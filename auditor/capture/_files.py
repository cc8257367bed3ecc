"""What every writer of the producer kit shares: atomic JSON files and who this process is.

A record is written whole or not at all: to a temporary file beside its place, flushed to
disk, then renamed over it (``os.replace`` is atomic on one filesystem), so a reader (the
audit, or ``seal``) never sees half a record, and a crash leaves the old one or none.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from auditor._text import json_line, printable

JOB_ID_VARIABLE = "AUDITOR_JOB_ID"
"""Set by ``auditor run`` in its command's environment: the job id it records (SLURM's, or
``--job-id`` outside SLURM), so the training processes' device files agree with the trial."""
GPUS_VARIABLE = "AUDITOR_GPUS"
"""Set by ``auditor run`` in its command's environment: the GPUs the period runs with
(``--gpus``), so a trainer may start one rank per GPU (the example trainer does)."""
ATTEMPT_DIR_VARIABLE = "AUDITOR_ATTEMPT_DIR"
"""Set by ``auditor run`` in its command's environment: the attempt directory (absolute)."""
SHUTDOWN_FLAG_VARIABLE = "AUDITOR_SHUTDOWN_FLAG"
"""Set by ``auditor run`` in its command's environment: the coordinated-shutdown flag's name
it classified with (``--flag``, else the protocol's), so each ``--step`` uses the same."""


def dumps(document: dict[str, Any]) -> bytes:
    """A JSON document as the kit writes it: two-space indent, keys in insertion order,
    UTF-8, a final newline (deterministic for equal documents). A text that is not UTF-8 (a
    command's argument, an environment value or a file name the system gave as bytes) is
    written :func:`~auditor._text.printable` (``\\xNN`` for each such byte): the record is
    written whatever the command was given, never lost after the command ran."""
    return (json_line(document, indent=2) + "\n").encode("utf-8")


TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>[0-9]+)(?:-[0-9a-f]{8})?$")
"""How :func:`write_atomic` names a temporary (``.NAME.tmp-PID-XXXXXXXX``, eight random hex
digits; ``.NAME.tmp-PID`` from earlier versions): what a writer killed mid-write leaves, and
the next seal or run removes."""


def open_regular(path: Path | str, follow: bool = False) -> BinaryIO:
    """``path`` opened for reading as a regular file only: a FIFO a worker left in the
    attempt is never waited on (``O_NONBLOCK``: the run would hang, holding its
    allocation), a device never read for ever, a link not followed unless ``follow``;
    anything but a regular file is an ``OSError``, which each reader takes as a file it
    cannot use."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


UNUSABLE_JSON = (ValueError, RecursionError)
"""What the standard library's ``json.loads`` raises on a document it cannot use: malformed
(``ValueError``), or nested deeper than the interpreter recurses (a hostile file: the run's
record must still be written)."""


def own_folder(folder: Path) -> Path:
    """``folder``, made if missing, refused if it is a link: a link put where the kit writes
    (``processes``, ``worker-logs``, ...) would lead its files out of the attempt, where it
    writes only where it is told (docs/security.md)."""
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():
        raise OSError(errno.ELOOP, "a link where the kit writes; not followed", str(folder))
    return folder


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    own_folder(path.parent)
    temporary = _write_temporary(path, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


_OWN: set[tuple[int, str]] = set()
"""(pid, path) of each file a process of this kit wrote with :func:`write_own` or claimed with
:func:`claim_own`: the files it may write again (a forked child, another pid, may not)."""

_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK,
                       errno.ENOSYS, errno.EXDEV})
"""What ``link`` raises on a file system without hard links (then a name is claimed with
``O_EXCL`` instead)."""


class NameTaken(FileExistsError):
    """A file the kit names by this process (host and pid) is there already and this process
    did not write it: another process of the same host name and pid did (nodes or containers
    that all report one hostname, each in its own pid namespace), and it is never
    overwritten."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(errno.EEXIST, f"{what} is there already, written by another process "
                         f"of the same host name and pid (nodes or containers that report one "
                         f"hostname, each with its own pid namespace?); not overwritten: give "
                         f"each node its own hostname", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def claim_own(path: Path, what: str = "a file of this name") -> bool:
    """Whether ``path`` is this process's to write: True when it wrote it before (a record
    written again, a trace reopened), False when the name is free (nothing is made);
    :class:`NameTaken` when another process's file is there."""
    if _own_key(path) in _OWN:
        return True
    if os.path.lexists(path):
        raise NameTaken(path, what)
    return False


OWN_LOCK = threading.RLock()
"""Held while a file of this process's name is claimed and first made (:func:`write_own`, a
:class:`~auditor.capture.Trace` opened): two threads of one process (a threaded Ray actor's
methods, each opening its trace) would otherwise each find the name free, and the second
take the first's file for another process's."""


def _fresh_lock() -> None:  # (a child forked while another thread held it must not wait)
    global OWN_LOCK
    OWN_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock)


def write_own(path: Path, data: bytes, what: str = "this process's file") -> None:
    """Write ``data`` to ``path`` as :func:`write_atomic` does, where only this process may:
    the first write takes the name atomically (``link``, never over a file there, or
    ``O_EXCL`` where the file system has no links), a later one replaces its own file; another
    process's file of the same name (same host name and pid) is :class:`NameTaken`, never
    overwritten (contract v1.2: a worker is never dropped silently). One thread at a time
    (:data:`OWN_LOCK`)."""
    with OWN_LOCK:
        _write_own(path, data, what)


def _write_own(path: Path, data: bytes, what: str) -> None:
    key = _own_key(path)
    if claim_own(path, what):
        write_atomic(path, data)
        return
    own_folder(path.parent)
    temporary = _write_temporary(path, data)
    try:
        os.link(temporary, path, follow_symlinks=False)
    except FileExistsError:
        temporary.unlink(missing_ok=True)
        raise NameTaken(path, what) from None
    except OSError as error:
        if error.errno not in _NO_LINKS:
            temporary.unlink(missing_ok=True)
            raise
        try:  # (no links here: claim the name, then replace the claim with the whole file)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        except FileExistsError:
            temporary.unlink(missing_ok=True)
            raise NameTaken(path, what) from None
        os.replace(temporary, path)
    else:
        temporary.unlink(missing_ok=True)
    _OWN.add(key)
    _fsync_directory(path.parent)


def open_own(path: Path, flags: int, what: str) -> int:
    """Open ``path`` (``flags``, the file made where absent) as this process's own: reopened
    where this process made it, else made with ``O_EXCL`` (another process's file of its name
    is :class:`NameTaken`, never opened), one thread at a time (:data:`OWN_LOCK`)."""
    with OWN_LOCK:
        reopened = claim_own(path, what)
        try:
            descriptor = os.open(path, flags | os.O_CREAT | (0 if reopened else os.O_EXCL),
                                 0o644)
        except FileExistsError:
            raise NameTaken(path, what) from None
        _OWN.add(_own_key(path))
        return descriptor


def _own_key(path: Path) -> tuple[int, str]:
    """(pid, the file's absolute path, its folder's links resolved): one file however it is
    named (an attempt directory given relative, then as ``auditor run`` exported it
    absolute, or from another working directory) is the same file of this process's."""
    return os.getpid(), os.path.join(os.path.realpath(path.parent), path.name)


def rename_new(source: Path, target: Path) -> bool:
    """Rename ``source`` to ``target`` unless a file is there (``link`` then ``unlink``:
    never over another's, where ``rename`` would replace it); False, nothing moved, when one
    is."""
    try:
        os.link(source, target, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in _NO_LINKS:
            raise
        if os.path.lexists(target):  # (no links here: looked at first, a small window left)
            return False
        os.rename(source, target)
        return True
    os.unlink(source)
    return True


def _write_temporary(path: Path, data: bytes) -> Path:
    """Write ``data`` to a new temporary beside ``path`` (the file it is to become), fsync it
    and return it. Its name is this writer's alone (``O_EXCL``, a random part beside the
    pid): two writers of one pid (two threads, or processes of one host name in pid
    namespaces of their own) never write into, or rename, each other's temporary."""
    while True:
        temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:  # (a link in the temporary's place is refused, not followed)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        break
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
    except BaseException as error:
        os.close(descriptor)
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # (a write names no file: the message then says it)
        raise
    os.close(descriptor)
    return temporary


def remove_temporaries(directory: Path, name: str | None = None, below: bool = False
                       ) -> list[str]:
    """Remove the temporaries of :func:`write_atomic` in ``directory`` (of the file ``name``
    only, when given; in every directory below it too, with ``below``) whose writers are
    over: the caller knows they are (it holds the seal's lock, or the attempt's job ended).
    Returns the paths removed, relative to ``directory``, sorted; links are never followed
    and a file that cannot be removed stays."""
    removed: list[str] = []
    for folder, folders, files in os.walk(directory):
        if not below:
            folders.clear()
        for file in files:
            found = TEMPORARY.match(file)
            if found is None or (name is not None and found["name"] != name):
                continue
            try:
                os.unlink(os.path.join(folder, file))
            except OSError:
                continue
            removed.append(os.path.relpath(os.path.join(folder, file), directory))
    return sorted(removed)


class LockError(Exception):
    """A lock that could not be taken; ``str()`` says why."""


@contextmanager
def locked(path: Path, wait_s: float = 600.0) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a record written by read, change, write): an
    ``fcntl.flock`` on ``.NAME.lock`` beside it, removed while still held (a waiter that
    locked the removed file tries again), so no lock file is left. :class:`LockError` when
    another holder keeps it ``wait_s``, or the file system has no locks."""
    lock = path.with_name(f".{path.name}.lock")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o644)
        except OSError as error:
            raise LockError(f"cannot make {lock.name} ({error.strerror})") from None
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockError(f"another seal has held it for {wait_s:g} s") from None
                    time.sleep(0.05)
                except OSError as error:
                    raise LockError(f"the file system takes no lock ({error.strerror}); "
                                    "on Lustre, mount with -o flock") from None
            try:
                current = os.stat(lock, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            mine = os.fstat(descriptor)
            if current is not None and (current.st_ino, current.st_dev) \
                    == (mine.st_ino, mine.st_dev):
                break
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)  # (the holder before removed it: lock the one there now)
    try:
        yield
    finally:
        with suppress(OSError):
            os.unlink(lock)
        os.close(descriptor)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every filesystem allows it)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def job_id() -> str | None:
    """The job id this process belongs to: ``auditor run``'s, else ``SLURM_JOB_ID``."""
    return os.environ.get(JOB_ID_VARIABLE) or os.environ.get("SLURM_JOB_ID") or None


def rank_of(rank: int | None) -> int:
    """``rank`` when given, else ``RANK``, else ``LOCAL_RANK``, else 0 (a lone process)."""
    if rank is not None:
        return int(rank)
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def attempt_dir_of(attempt_dir: str | os.PathLike[str] | None) -> Path:
    """``attempt_dir`` when given, else the one ``auditor run`` exported."""
    if attempt_dir is not None:
        return Path(attempt_dir)
    exported = os.environ.get(ATTEMPT_DIR_VARIABLE)
    if not exported:
        raise ValueError(f"no attempt directory given and {ATTEMPT_DIR_VARIABLE} is not set "
                         "(run the command under 'auditor run', or pass attempt_dir)")
    return Path(exported)


def nspid() -> list[int] | None:
    """This process's ``NSpid`` line of ``/proc/self/status``: its pid in each pid namespace,
    outermost first (inside a container, the first is the host's pid that NVML reports);
    None where the kernel does not say (not Linux, or older than 4.1)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return [int(part) for part in line.split()[1:]]
    except (OSError, ValueError):
        return None
    return None


def hostname() -> str:
    """The node's name as the scheduler knows it (short form, as sacct's NodeList)."""
    return socket.gethostname().split(".", 1)[0]


def pair_name_problem(pair: str) -> str | None:
    """Why ``pair`` is no pair's name (one directory name: no ``/``, no ``..``, no control
    character, which a terminal would obey when the name is printed), or None."""
    if not pair or pair in (".", "..") or "/" in pair or "\\" in pair \
            or any(char < " " or "\x7f" <= char <= "\x9f" or "\ud800" <= char <= "\udfff"
                   for char in pair):
        return (f"--pair {printable(pair)!r}: a pair's name is one directory name (no '/', "
                "no '..', no control character, UTF-8: a record names it)")
    return None

