"""Keep the workers' own output (contract v1.2, "Worker logs"): what a framework writes apart
from the driver's log, copied into ``ATTEMPT/worker-logs/`` before ``auditor run`` exits.

- **Ray**: each worker's ``session_*/logs/worker-*.out|.err`` of the session this run
  started, under ``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp`` (``ray/session_*``), kept as
  ``<host>-<pid>.out|.err``. A session is this run's when the process that started it (the
  pid its name ends with) was the command or one of its descendants: another job's session
  on the node is never copied. Seed 002's driver lost its last ``step:`` line to
  ``ray.shutdown()``; the worker's own copy held it every time.
- **torchrun**: the per-rank ``stdout.log``/``stderr.log`` under the ``--log-dir`` the
  command gives torchrun, kept as ``<host>-rank<r>.out|.err`` (the last attempt's; earlier
  attempts' are named in the notes).

The kit never points a framework's temporary directory into the attempt. Nothing here
fails a run: what was not found is a note in the trial record.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from auditor.capture._files import open_regular, own_folder
from auditor.model.kinds import WORKER_LOG

_SESSION = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(?P<pid>\d+)")
_RAY_WORKER = re.compile(r"worker-[0-9a-f]+-[0-9a-f]+-(?P<pid>\d+)\.(?P<ext>out|err)")
_TORCHRUN = re.compile(r"(?:^|/)(?:torchrun|torch\.distributed\.run)$")


@dataclass
class Kept:
    """What :func:`keep_worker_logs` copied, and what it has to say."""

    files: list[str] = field(default_factory=list)
    """The kept files, below the attempt directory."""
    notes: list[str] = field(default_factory=list)


def ray_base(environ: Mapping[str, str]) -> Path:
    """Where Ray keeps its sessions: ``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp``."""
    return Path(environ.get("RAY_TMPDIR") or environ.get("TMPDIR") or "/tmp") / "ray"


def keep_worker_logs(directory: Path, host: str, command: Sequence[str], pids: Iterable[int],
                     environ: Mapping[str, str]) -> Kept:
    """Copy the worker logs of this run (see the module docstring) into ``directory``."""
    kept = Kept()
    ours = set(pids)
    base = ray_base(environ)
    sessions: list[str] = []
    try:
        sessions = sorted(entry.path for entry in os.scandir(base) if not entry.is_symlink()
                          and (found := _SESSION.fullmatch(entry.name)) is not None
                          and int(found["pid"]) in ours)
    except OSError:
        pass
    for session in sessions:
        logs = Path(session) / "logs"
        for path in sorted(logs.glob("worker-*")):
            found = _RAY_WORKER.fullmatch(path.name)
            if found is not None:
                _copy(path, directory, WORKER_LOG.path_for(host=host, pid=int(found["pid"]))
                      .rsplit(".", 1)[0] + "." + found["ext"], kept)
    log_dir = torchrun_log_dir(command)
    if log_dir is not None:
        _keep_torchrun(Path(log_dir), directory, host, kept)
    if not sessions and log_dir is None:
        kept.notes.append(f"no worker logs: no Ray session of this run under {base}, no "
                          "torchrun --log-dir")
    return kept


def torchrun_log_dir(command: Sequence[str]) -> str | None:
    """The ``--log-dir`` (or ``--log_dir``) a torchrun command line gives, else None."""
    args = list(command)
    start = next((i for i, arg in enumerate(args) if _TORCHRUN.search(arg)), None)
    if start is None:
        return None
    for index in range(start + 1, len(args)):
        arg = args[index]
        for name in ("--log-dir", "--log_dir"):
            if arg == name and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _keep_torchrun(log_dir: Path, directory: Path, host: str, kept: Kept) -> None:
    """Each rank's ``stdout.log``/``stderr.log`` (``<run>/attempt_<n>/<rank>/``): the
    last attempt's kept, earlier ones noted."""
    found: dict[tuple[int, str], list[Path]] = {}
    for path in sorted(log_dir.glob("*/attempt_*/*/std*.log")):
        local = path.parent.name
        if local.isdigit() and path.name in ("stdout.log", "stderr.log"):
            found.setdefault((int(local), path.name), []).append(path)
    if not found:
        kept.notes.append(f"no per-rank logs under torchrun's --log-dir {log_dir}")
    for (rank, name), paths in sorted(found.items()):
        paths.sort(key=lambda p: (_attempt(p), str(p)))
        extension = "out" if name == "stdout.log" else "err"
        _copy(paths[-1], directory, f"{WORKER_LOG.directory}/{host}-rank{rank}.{extension}",
              kept)
        kept.notes.extend(f"{path}: an earlier attempt's, not kept" for path in paths[:-1])


def _attempt(path: Path) -> int:
    name = path.parent.parent.name
    return int(name.split("_", 1)[1]) if name.startswith("attempt_") and \
        name.split("_", 1)[1].isdigit() else -1


def _copy(source: Path, directory: Path, relative: str, kept: Kept) -> None:
    """Copy ``source`` to ``directory/relative`` (never over a file there, never through a
    link), noting what could not be."""
    target = directory / relative
    made = False
    try:
        own_folder(target.parent)
        with open_regular(source, follow=True) as reading:  # (a FIFO: never waited on)
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o644)
            made = True
            with os.fdopen(descriptor, "wb") as writing:
                shutil.copyfileobj(reading, writing, 1 << 20)
                writing.flush()
                os.fsync(writing.fileno())
    except OSError as error:
        if made:  # (a copy cut short is no evidence, and its room is the trial record's)
            with contextlib.suppress(OSError):
                os.unlink(target)
        kept.notes.append(f"{source}: not kept as {relative} ({error.strerror or error})")
        return
    kept.files.append(relative)
