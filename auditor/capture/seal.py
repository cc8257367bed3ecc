"""``auditor seal``: write a period record, ``pairs/<pair>/period-<n>.json``, for an attempt.

The record is the period's manifest: every file under the attempt directory with its
kind (from its name), SHA-256 and size; the workers (from the device files and the
traces); the job and array ids (from the trial record); ``sealed_ns`` and ``sealed_by``.
Sealing proves the evidence has not changed *since* it was sealed, not before: the audit
compares ``sealed_ns`` with the attempt's end.

Sealing a period again after a retry adds that attempt to the ``attempts`` list (launch
order, told apart by restart count: a requeued job keeps its id). Sealing an attempt again
exactly as it was sealed changes nothing; a different record, or an attempt that would be
sealed differently, is refused (:class:`SealRefused`). Writes are atomic.

``idle_check`` asks NVML whether the GPUs were left idle; it refuses on another node than
the trial's or outside its job; without NVML it records that no check could be made.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from auditor import __version__
from auditor.capture._files import dumps, hostname, write_atomic
from auditor.capture.device import idle_check as check_idle
from auditor.model.kinds import ALLOCATOR_TRACE, DEVICE_EVIDENCE, TRIAL, kind_of

_COMMIT = re.compile(r"[0-9a-f]{7,64}")
ATTEMPT_FIELDS = ("job_id", "restart_count", "attempt_dir", "workers", "evidence")
"""What an attempt is sealed with (an ``attempts`` item; the single form has them on top)."""
PERIOD_FIELDS = ("schema", "study", "pair", "workload", "seed", "model", "period", "gpus",
                 "array_job_id", "array_task_id", "commit")
"""What every attempt of one period shares."""


class SealRefused(ValueError):
    """``auditor seal`` will not write (one line saying why)."""


@dataclass(frozen=True, slots=True)
class SealSpec:
    """What ``auditor seal`` was asked to do."""

    root: Path
    pair: str
    period: int
    gpus: int
    attempt_dir: str
    """Relative to ``root``."""
    commit: str
    workload: str | None = None
    seed: int | None = None
    model: str | None = None
    study: str | None = None
    """None: the root directory's name."""
    idle_check: bool = False


@dataclass(frozen=True, slots=True)
class SealResult:
    """What ``seal`` did."""

    path: Path
    written: bool
    """False: the identical attempt was sealed already (nothing changed)."""
    attempts: int
    files: int
    missing: tuple[str, ...]
    """Fields the audit requires that were not given (workload, seed, model)."""
    idle_check: dict[str, Any] | None


def _attempt_dir(spec: SealSpec) -> tuple[Path, str]:
    relative = PurePosixPath(spec.attempt_dir)
    if relative.is_absolute() or ".." in relative.parts or str(relative) in ("", "."):
        raise SealRefused(f"--attempt-dir {spec.attempt_dir!r}: must be relative to the root, "
                          "without '..'")
    directory = spec.root / relative
    _no_link_on_the_way(spec.root, relative.parts)
    try:
        mode = os.lstat(directory).st_mode
    except OSError as error:
        raise SealRefused(f"{directory}: {error.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise SealRefused(f"{directory}: not a directory (a link is not followed)")
    return directory, relative.as_posix()


def _no_link_on_the_way(root: Path, parts: tuple[str, ...]) -> None:
    """Refuse a path below ``root`` that passes through a link (it could lead out of the
    root: seal reads and writes only inside it)."""
    current = root
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise SealRefused(f"{current}: a link on the way; not followed, not sealed")


def check_pair_name(pair: str) -> None:
    """A pair's name is one path component (no ``/``, no ``..``): it names a directory."""
    if not pair or pair in (".", "..") or "/" in pair or "\\" in pair or "\0" in pair:
        raise SealRefused(f"--pair {pair!r}: a pair's name is one directory name (no '/', "
                          "no '..')")


def _files(directory: Path) -> list[str]:
    """Every file under ``directory`` (root-relative to it, sorted); refuses a link or
    anything that is not a regular file (its content could change under the hash)."""
    found: list[str] = []

    def unreadable(error: OSError) -> None:
        raise SealRefused(f"{error.filename}: cannot list ({error.strerror}); not sealed")

    for current, dirs, names in os.walk(directory, onerror=unreadable, followlinks=False):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(current, name)):
                raise SealRefused(f"{os.path.join(current, name)}: a link; not sealed")
        for name in names:
            path = os.path.join(current, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise SealRefused(f"{path}: not a regular file; not sealed")
            found.append(os.path.relpath(path, directory).replace(os.sep, "/"))
    return sorted(found)


def _hash(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _workers(directory: Path, files: list[str]) -> list[dict[str, Any]]:
    """(role, rank, pid) of every worker: from its device file, else from the first phase
    record of its trace; sorted by role, rank, pid."""
    found: dict[int, dict[str, Any]] = {}
    for relative in files:
        kind = kind_of(relative)
        if kind == DEVICE_EVIDENCE.name:
            document = _json(directory / relative) or {}
            _add_worker(found, document.get("role"), document.get("rank"), document.get("pid"))
        elif kind == ALLOCATOR_TRACE.name:
            for record in _first_phase(directory / relative):
                _add_worker(found, record.get("role"), record.get("rank"), record.get("pid"))
    return sorted(found.values(), key=lambda w: (w["role"], w["rank"], w["pid"]))


def _add_worker(found: dict[int, dict[str, Any]], role: object, rank: object,
                pid: object) -> None:
    if type(role) is str and type(rank) is int and type(pid) is int and pid not in found:
        found[pid] = {"role": role, "rank": rank, "pid": pid}


def _first_phase(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, "rb") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    return []
                if isinstance(record, dict) and "phase" in record:
                    return [record]
    except OSError:
        pass
    return []


def attempt_entry(spec: SealSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the attempt as sealed, its trial record): refuses without exactly one readable trial
    record naming this pair, period and GPU count."""
    directory, relative = _attempt_dir(spec)
    files = _files(directory)
    trials = [name for name in files if kind_of(name) == TRIAL.name]
    if len(trials) != 1:
        raise SealRefused(f"{directory}: {len(trials)} trial records (one expected: "
                          "'auditor run' writes it when the attempt ends)")
    trial = _json(directory / trials[0])
    if trial is None:
        raise SealRefused(f"{directory / trials[0]}: not a readable JSON object")
    for name, want in (("pair", spec.pair), ("period", spec.period), ("gpus", spec.gpus)):
        if trial.get(name) != want:
            raise SealRefused(f"{directory / trials[0]}: {name} is {trial.get(name)!r}, not "
                              f"{want!r} as asked")
    if not isinstance(trial.get("job_id"), str):
        raise SealRefused(f"{directory / trials[0]}: no job_id")
    evidence = []
    for name in files:
        sha256, size = _hash(directory / name)
        evidence.append({"path": name, "kind": kind_of(name), "sha256": sha256, "size": size})
    restart = trial.get("restart_count")
    entry = {"job_id": trial["job_id"], "restart_count": restart if type(restart) is int else 0,
             "attempt_dir": relative, "workers": _workers(directory, files),
             "evidence": evidence}
    return entry, trial


def _period_fields(spec: SealSpec, trial: dict[str, Any]) -> dict[str, Any]:
    """The fields every attempt of the period shares. Outside a job array the job is its
    own array (the trial's job id, task 0)."""
    array_job = trial.get("array_job_id") or trial["job_id"]
    task = trial.get("array_task_id")
    fields: dict[str, Any] = {"schema": "run-evidence/period/v1",
                              "study": spec.study or spec.root.resolve().name,
                              "pair": spec.pair, "workload": spec.workload, "seed": spec.seed,
                              "model": spec.model, "period": spec.period, "gpus": spec.gpus,
                              "array_job_id": array_job,
                              "array_task_id": task if type(task) is int else 0,
                              "commit": spec.commit}
    return {key: value for key, value in fields.items() if value is not None}


def _check_idle_where(trial: dict[str, Any]) -> dict[str, Any]:
    """Refuse an idle check off the trial's node or outside its job; else make it."""
    here, there = hostname(), trial.get("hostname")
    if there != here:
        raise SealRefused(f"--idle-check on {here}, but the attempt ran on {there!r}: the "
                          "check must run on the attempt's node, inside its job")
    job = os.environ.get("SLURM_JOB_ID")
    if job != trial.get("job_id"):
        raise SealRefused(f"--idle-check outside the attempt's job (SLURM_JOB_ID is {job!r}, "
                          f"the attempt's job {trial.get('job_id')!r}): run seal in the batch "
                          "script, after 'auditor run'")
    return check_idle()


def seal(spec: SealSpec) -> SealResult:
    """Seal the attempt into the period record (see the module docstring)."""
    if not _COMMIT.fullmatch(spec.commit):
        raise SealRefused(f"commit {spec.commit!r}: a git object id (7-64 lower-case hex "
                          "digits) expected")
    check_pair_name(spec.pair)
    entry, trial = attempt_entry(spec)
    shared = _period_fields(spec, trial)
    idle = _check_idle_where(trial) if spec.idle_check else None
    path = spec.root / "pairs" / spec.pair / f"period-{spec.period}.json"
    for place in (spec.root / "pairs", path.parent):  # (never written through a link)
        if place.is_symlink():
            raise SealRefused(f"{place}: a link; the period record is written only inside "
                              "the root")
    missing = tuple(name for name in ("workload", "seed", "model") if name not in shared)
    existing = _existing(path)
    if existing is None:
        record = {**shared, **entry}
        attempts = 1
    else:
        old_shared = {key: existing[key] for key in PERIOD_FIELDS if key in existing}
        if old_shared != shared:
            changed = sorted(key for key in set(old_shared) | set(shared)
                             if old_shared.get(key) != shared.get(key))
            raise SealRefused(f"{path}: already holds a different record (differing: "
                              f"{', '.join(changed)}); not overwritten")
        old_attempts = _attempts_of(existing)
        same = [a for a in old_attempts if a.get("attempt_dir") == entry["attempt_dir"]
                or (a.get("job_id"), a.get("restart_count"))
                == (entry["job_id"], entry["restart_count"])]
        if same:
            if same[0] != entry:
                raise SealRefused(f"{path}: attempt {entry['attempt_dir']} (job "
                                  f"{entry['job_id']}, restart {entry['restart_count']}) is "
                                  "already sealed differently (its evidence changed since?)")
            return SealResult(path, False, len(old_attempts), len(entry["evidence"]), missing,
                              None)
        merged = sorted([*old_attempts, entry], key=lambda a: a.get("restart_count") or 0)
        record = {**shared, "attempts": merged}
        if "idle_check" in existing and idle is None:
            record["idle_check"] = existing["idle_check"]
        attempts = len(merged)
    if idle is not None:
        record["idle_check"] = idle
    record["sealed_ns"] = time.time_ns()
    record["sealed_by"] = {"tool": "auditor", "version": __version__}
    write_atomic(path, dumps(record))
    return SealResult(path, True, attempts, len(entry["evidence"]), missing, idle)


def _existing(path: Path) -> dict[str, Any] | None:
    if not os.path.lexists(path):
        return None
    document = _json(path)
    if document is None:
        raise SealRefused(f"{path}: exists but is not a readable period record; not "
                          "overwritten")
    return document


def _attempts_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    if isinstance(record.get("attempts"), list):
        return [a for a in record["attempts"] if isinstance(a, dict)]
    return [{key: record[key] for key in ATTEMPT_FIELDS if key in record}]
