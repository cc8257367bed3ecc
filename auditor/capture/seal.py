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
the trial's or outside its job; without NVML it records that no check could be made. On a
multi-node attempt each node checks its own (``idle_check_only``: ``ATTEMPT/idle/<host>.json``,
e.g. ``srun --ntasks-per-node=1 auditor seal --idle-check-only``) and the one seal on the
batch node gathers them into ``idle_check.hosts`` (contract v1.2).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from auditor import __version__
from auditor._text import printable
from auditor.capture._files import (
    TEMPORARY,
    LockError,
    dumps,
    hostname,
    locked,
    pair_name_problem,
    remove_temporaries,
    write_atomic,
)
from auditor.capture.device import idle_check as check_idle
from auditor.capture.processes import attempt_processes
from auditor.capture.roster import SealRefused, _json, _regular, _workers
from auditor.model.kinds import (
    DOCUMENT_LIMIT,
    IDLE_CHECK,
    TRIAL,
    WORKER_LOG,
    kind_of,
)

_COMMIT = re.compile(r"[0-9a-f]{7,64}")
ATTEMPT_FIELDS = ("job_id", "restart_count", "attempt_dir", "workers", "evidence")
"""What an attempt is sealed with (an ``attempts`` item; the single form has them on top)."""
PERIOD_FIELDS = ("schema", "study", "pair", "workload", "seed", "model", "period", "gpus",
                 "array_job_id", "array_task_id", "commit")
"""What every attempt of one period shares."""


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
    idle_check_only: bool = False
    """Only check this node and write ``ATTEMPT/idle/<host>.json`` (contract v1.2)."""


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
    removed: tuple[str, ...] = ()
    """Temporaries a killed seal of this record left, removed (beside the record)."""


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
    problem = pair_name_problem(pair)
    if problem is not None:
        raise SealRefused(problem)


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
                raise SealRefused(f"{printable(path)}: not a regular file; not sealed")
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            if (temporary := TEMPORARY.match(name)) is not None:  # (never pinned as evidence)
                raise SealRefused(
                    f"{printable(path)}: a write in progress or cut short (writer pid "
                    f"{temporary['pid']}: a rank killed mid-write?); seal once the attempt has "
                    "ended, or remove it (it is no evidence); not sealed")
            if printable(rel) != rel:  # (a record is JSON, which holds UTF-8 text only)
                raise SealRefused(f"{printable(path)}: a file name that is not UTF-8 cannot "
                                  "be pinned by a period record; rename it, then seal")
            found.append(rel)
    return sorted(found)


def _hash(base: Path, relative: str) -> tuple[str, int, int]:
    """The file's SHA-256, size and modification time (its own clock's, ns), refused when it
    changed as it was read (its pin would hold neither what it was nor what it became)."""
    digest = hashlib.sha256()
    size = 0
    with _regular(base, relative) as handle:
        before = os.fstat(handle.fileno())
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
        after = os.fstat(handle.fileno())
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) \
            or size != after.st_size:
        raise SealRefused(f"{printable(str(base / relative))}: changed while it was hashed; "
                          "seal once the attempt's files are written")
    return digest.hexdigest(), size, after.st_mtime_ns


def attempt_entry(spec: SealSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the attempt as sealed, its trial record): refuses without exactly one readable trial
    record naming this pair, period and GPU count."""
    directory, relative = _attempt_dir(spec)
    files = _files(directory)
    trials = [name for name in files if kind_of(name) == TRIAL.name]
    if len(trials) != 1:
        raise SealRefused(f"{directory}: {len(trials)} trial records (one expected: "
                          "'auditor run' writes it when the attempt ends)")
    trial = _json(directory, trials[0])
    if trial is None:
        raise SealRefused(f"{directory / trials[0]}: not a readable JSON object")
    for name, want in (("pair", spec.pair), ("period", spec.period), ("gpus", spec.gpus)):
        if trial.get(name) != want:
            raise SealRefused(f"{directory / trials[0]}: {name} is {trial.get(name)!r}, not "
                              f"{want!r} as asked")
    if not isinstance(trial.get("job_id"), str):
        raise SealRefused(f"{directory / trials[0]}: no job_id")
    _steps_quiet(directory)
    evidence = []
    modified: dict[str, int] = {}
    for name in files:
        sha256, size, modified[name] = _hash(directory, name)
        evidence.append({"path": name, "kind": kind_of(name), "sha256": sha256, "size": size})
    _settled(directory, files, evidence, modified)
    restart = trial.get("restart_count")
    entry = {"job_id": trial["job_id"], "restart_count": restart if type(restart) is int else 0,
             "attempt_dir": relative, "workers": _workers(directory, files),
             "evidence": evidence}
    return entry, trial


STEP_QUIET_S = 2.0
"""How long a ``--step``'s output without its process record is watched before the seal: one
that grows meanwhile is a step still running (its record comes when it ends)."""


def _steps_quiet(directory: Path) -> None:
    """Refuse a seal while a ``--step`` still runs: its output without its process record
    (:func:`~auditor.capture.processes.attempt_processes`) that is still written to, watched
    for :data:`STEP_QUIET_S` (the file's own size and modification time, never this node's
    clock). One whose node died stays quiet: sealed as it is, its end unknown to the audit.
    Sealed while running, the period could never be sealed again once the step ended (its
    output grown, its record come)."""
    outputs = [p.path for p in attempt_processes(directory)
               if p.exit_code is None and p.path and p.path.startswith(
                   f"{WORKER_LOG.directory}/")]
    if not outputs:
        return

    def looks() -> dict[str, tuple[int, int] | None]:
        found: dict[str, tuple[int, int] | None] = {}
        for relative in outputs:
            try:
                info = os.lstat(directory / relative)
                found[relative] = (info.st_size, info.st_mtime_ns)
            except OSError:
                found[relative] = None
        return found

    before = looks()
    time.sleep(STEP_QUIET_S)
    after = looks()
    moving = [relative for relative in outputs if before[relative] != after[relative]]
    if moving:
        raise SealRefused(
            f"{printable(str(directory / moving[0]))}: a step's output, written to while the "
            "seal looked, and no process record of its step yet: the step still runs; seal "
            "once it ended (its record is written then)"
            + (f" ({len(moving) - 1} more such)" if len(moving) > 1 else ""))


def _settled(directory: Path, files: list[str], evidence: list[dict[str, Any]],
             modified: dict[str, int]) -> None:
    """Refuse a seal of an attempt still being written: once every file is hashed, each is
    looked at again, and one come, gone, grown or written since it was hashed (its
    modification time moved: the file system's own clock, never compared with this node's,
    which an NFS server's need not match) is named (a straggler appending to a worker log
    pinned a moving target, and the period could never be sealed again once it stopped)."""
    now = _files(directory)
    if now != files:
        came = sorted(set(now) - set(files)) or sorted(set(files) - set(now))
        raise SealRefused(f"{printable(str(directory / came[0]))}: came or went while the "
                          "attempt was sealed; seal once the attempt's files are written")
    for entry in evidence:
        path = directory / entry["path"]
        try:
            info = os.lstat(path)
        except OSError as error:
            raise SealRefused(f"{printable(str(path))}: cannot be looked at again "
                              f"({error.strerror}); not sealed") from None
        if info.st_size != entry["size"] or info.st_mtime_ns != modified[entry["path"]]:
            raise SealRefused(f"{printable(str(path))}: written to while the attempt was "
                              "sealed (is a process still writing it?); seal once the "
                              "attempt's files are written")


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


def _outside_a_scheduler(root: Path) -> bool:
    """Whether the seal runs in no scheduler's job where the study says it has none
    (``protocol.json``'s ``"scheduler": "none"``: a workstation's, a Kubernetes pod's): its
    job is the one ``auditor run --job-id`` named, which no variable here can confirm."""
    if os.environ.get("SLURM_JOB_ID") is not None:
        return False
    from auditor.capture.check import root_protocol

    protocol = root_protocol(root)
    return protocol is not None and protocol.scheduler == "none"


def _check_idle_where(trial: dict[str, Any], root: Path) -> dict[str, Any]:
    """Refuse an idle check off the trial's node or outside its job; else make it."""
    here, there = hostname(), trial.get("hostname")
    if there != here:
        raise SealRefused(f"--idle-check on {here}, but the attempt ran on {there!r}: the "
                          "check must run on the attempt's node, inside its job")
    job = os.environ.get("SLURM_JOB_ID")
    if job != trial.get("job_id") and not _outside_a_scheduler(root):
        raise SealRefused(f"--idle-check outside the attempt's job (SLURM_JOB_ID is {job!r}, "
                          f"the attempt's job {trial.get('job_id')!r}): run seal in the batch "
                          "script, after 'auditor run'")
    return check_idle()


def check_node(spec: SealSpec) -> tuple[Path, dict[str, Any]]:
    """``seal --idle-check-only``: check this node's GPUs and write the result to
    ``ATTEMPT/idle/<host>.json`` (atomically, never over an earlier one), inside the
    attempt's job; returns (its path, the result)."""
    check_pair_name(spec.pair)
    directory, _ = _attempt_dir(spec)
    job = os.environ.get("SLURM_JOB_ID")
    trials = [name for name in os.listdir(directory) if kind_of(name) == TRIAL.name]
    trial = _json(directory, trials[0]) if len(trials) == 1 else None
    if trial is not None and job != trial.get("job_id") and not _outside_a_scheduler(spec.root):
        raise SealRefused(f"--idle-check-only outside the attempt's job (SLURM_JOB_ID is "
                          f"{job!r}, the attempt's job {trial.get('job_id')!r})")
    host = hostname()
    path = directory / IDLE_CHECK.path_for(host=host)
    if os.path.lexists(path):
        raise SealRefused(f"{path}: this node's idle check is written already; not "
                          "overwritten")
    _no_link_on_the_way(directory, (IDLE_CHECK.directory, path.name))
    result = {"schema": "run-evidence/idle-check/v1", "host": host, **check_idle()}
    write_atomic(path, dumps(result))
    return path, result


def _gathered(directory: Path, files: list[str]) -> dict[str, Any] | None:
    """The nodes' own idle checks (``idle/<host>.json``) as the period record's
    ``idle_check``: ``hosts`` by host, and ``passed`` only when every one passed (False
    when one did not; null with ``unavailable`` when one could not be made)."""
    hosts: dict[str, dict[str, Any]] = {}
    for relative in files:
        if kind_of(relative) != IDLE_CHECK.name:
            continue
        document = _json(directory, relative) or {}
        host = document.get("host")
        named = IDLE_CHECK.parts(relative) or {}
        if not isinstance(host, str) or host != named.get("host"):
            raise SealRefused(f"{directory / relative}: not one node's idle check (its host "
                              f"{host!r} is not its name's)")
        hosts[host] = {key: document.get(key) for key in ("passed", "unavailable",
                                                           "checked_ns")}
    if not hosts:
        return None
    results = [item["passed"] for item in hosts.values()]
    unmade = [f"{host}: {item['unavailable']}" for host, item in sorted(hosts.items())
              if item["passed"] is None]
    checked = [item["checked_ns"] for item in hosts.values() if type(item["checked_ns"]) is int]
    return {"passed": False if False in results else None if unmade else True,
            **({"unavailable": "; ".join(unmade)} if unmade else {}),
            "checked_ns": max(checked) if checked else None, "hosts": dict(sorted(hosts.items()))}


def seal(spec: SealSpec) -> SealResult:
    """Seal the attempt into the period record (see the module docstring)."""
    if not _COMMIT.fullmatch(spec.commit):
        raise SealRefused(f"commit {spec.commit!r}: a git object id (7-64 lower-case hex "
                          "digits) expected")
    check_pair_name(spec.pair)
    if spec.idle_check:
        directory, _ = _attempt_dir(spec)
        if (directory / IDLE_CHECK.directory).is_dir() and not os.path.lexists(
                directory / IDLE_CHECK.path_for(host=hostname())):
            check_node(spec)  # (the batch node's own, beside the other nodes')
    entry, trial = attempt_entry(spec)
    shared = _period_fields(spec, trial)
    directory, _ = _attempt_dir(spec)
    idle = _gathered(directory, [e["path"] for e in entry["evidence"]])
    if idle is None and spec.idle_check:
        idle = _check_idle_where(trial, spec.root)
    path = spec.root / "pairs" / spec.pair / f"period-{spec.period}.json"
    for place in (spec.root / "pairs", path.parent):  # (never written through a link)
        if place.is_symlink():
            raise SealRefused(f"{place}: a link; the period record is written only inside "
                              "the root")
    missing = tuple(name for name in ("workload", "seed", "model") if name not in shared)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with locked(path):  # (two seals of one period: each reads what the other wrote)
            removed = remove_temporaries(path.parent, path.name)  # (a killed seal's)
            return _merged(spec, path, shared, entry, idle, missing, removed)
    except LockError as error:
        raise SealRefused(f"{path}: cannot lock the period record: {error}") from None


def _merged(spec: SealSpec, path: Path, shared: dict[str, Any], entry: dict[str, Any],
            idle: dict[str, Any] | None, missing: tuple[str, ...], removed: list[str]
            ) -> SealResult:
    """Write the record with ``entry`` added to what is there now (under its lock)."""
    existing = _existing(path)
    if existing is None:
        record = {**shared, **entry}
        attempts = 1
    else:
        old_shared = {key: existing[key] for key in PERIOD_FIELDS if key in existing}
        if spec.study is None and isinstance(existing.get("study"), str):
            # (no --study: the name the record was first sealed under, which a root moved
            # or renamed between a requeue's two seals does not change; never the protocol's
            # name, which several studies may share)
            shared = {**shared, "study": existing["study"]}
        if old_shared != shared:
            changed = sorted(key for key in set(old_shared) | set(shared)
                             if old_shared.get(key) != shared.get(key))
            raise SealRefused(f"{path}: already holds a different record (differing: "
                              f"{', '.join(changed)}); not overwritten")
        old_attempts = _attempts_of(existing)
        checks = _own_checks(old_attempts, existing.get("idle_check"))
        bare = [{k: v for k, v in a.items() if k != "idle_check"} for a in old_attempts]
        same = [a for a in bare if a.get("attempt_dir") == entry["attempt_dir"]
                or (a.get("job_id"), a.get("restart_count"))
                == (entry["job_id"], entry["restart_count"])]
        if same:
            if same[0] != entry:
                raise SealRefused(f"{path}: attempt {entry['attempt_dir']} (job "
                                  f"{entry['job_id']}, restart {entry['restart_count']}) is "
                                  "already sealed differently (its evidence changed since?)")
            had = checks.get(_run_of(same[0]))
            if idle is not None and not (isinstance(had, dict)
                                         and had.get("passed") == idle.get("passed")):
                # (a check just made, a failed one above all, is never dropped unsaid)
                said = f"passed={had.get('passed')!r}" if isinstance(had, dict) else "none"
                raise SealRefused(
                    f"{path}: attempt {entry['attempt_dir']} is sealed already; the idle "
                    f"check just made (passed={idle.get('passed')!r}) is not its own "
                    f"({said}), and a sealed record is not changed")
            return SealResult(path, False, len(old_attempts), len(entry["evidence"]), missing,
                              None, tuple(removed))
        if idle is not None:
            checks[_run_of(entry)] = idle
        merged = sorted([*bare, entry], key=lambda a: a.get("restart_count") or 0)
        last = merged[-1]
        # each earlier attempt keeps its own check in its entry; the record's is the last
        # attempt's (a requeue's seal replaced the first run's, a failed one above all, and
        # a seal out of order put an earlier run's in the last one's place)
        record = {**shared, "attempts": [
            {**a, "idle_check": checks[_run_of(a)]}
            if a is not last and _run_of(a) in checks else a for a in merged]}
        if _run_of(last) in checks:
            record["idle_check"] = checks[_run_of(last)]
        attempts = len(merged)
    if existing is None and idle is not None:
        record["idle_check"] = idle
    record["sealed_ns"] = time.time_ns()
    record["sealed_by"] = {"tool": "auditor", "version": __version__}
    data = dumps(record)
    if len(data) > DOCUMENT_LIMIT:  # (the audit would call the whole period unreadable)
        listed = len(record.get("evidence") or ()) + sum(
            len(a.get("evidence") or ()) for a in record.get("attempts") or ())
        raise SealRefused(
            f"{path}: the period record would be {len(data):,} bytes ({listed:,} files "
            f"listed), over the {DOCUMENT_LIMIT:,} bytes the audit reads; keep checkpoints "
            "and other bulk outside the attempt directory; not sealed")
    write_atomic(path, data)
    return SealResult(path, True, attempts, len(entry["evidence"]), missing, idle,
                      tuple(removed))


def _run_of(attempt: dict[str, Any]) -> str:
    """An attempt entry's own name in the record: its directory."""
    return str(attempt.get("attempt_dir"))


def _own_checks(attempts: list[dict[str, Any]], record_check: object
                ) -> dict[str, dict[str, Any]]:
    """Each sealed attempt's own idle check, by :func:`_run_of`: an earlier attempt's in its
    entry, the last one's the record's."""
    checks = {_run_of(a): a["idle_check"] for a in attempts
              if isinstance(a.get("idle_check"), dict)}
    if attempts and isinstance(record_check, dict):
        last = max(attempts, key=lambda a: a.get("restart_count") or 0)
        checks.setdefault(_run_of(last), record_check)
    return checks


def _existing(path: Path) -> dict[str, Any] | None:
    if not os.path.lexists(path):
        return None
    if os.path.islink(path):  # (it could lead out of the root: neither read nor replaced)
        raise SealRefused(f"{path}: a link in the period record's place; not followed, not "
                          "overwritten")
    document = _json(path.parent, path.name)
    if document is None:
        raise SealRefused(f"{path}: exists but is not a readable period record; not "
                          "overwritten")
    return document


def _attempts_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    if isinstance(record.get("attempts"), list):
        return [a for a in record["attempts"] if isinstance(a, dict)]
    return [{key: record[key] for key in ATTEMPT_FIELDS if key in record}]
