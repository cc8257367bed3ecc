"""A rerun plan: an audit's unresolved periods, grouped by why, as ``--array=`` specs.

Read from the audit's ``periods.parquet`` (pinned by its output manifest: a table changed
since the audit is refused, and so is one of columns or values no audit writes, re-pinned
or not). Resolved and failed periods are never listed: a failed one is
a measurement. Each group's elements are the array task ids of its periods, compressed
into ranges (``3,7,12-14``); a period without an array task id (a retry outside the array)
is named instead. One array element may run several periods: rerunning it reruns them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from auditor._io import regular_bytes
from auditor.errors import InputError, UsageError

GROUPS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("infrastructure", "the node, the job step, a kill or a failure outside the trainer's own "
     "code ended the run",
     frozenset({"infrastructure_failure", "killed", "unclean_exit"})),
    ("time_limit", "Slurm's time limit ended the run (rerun with more time)",
     frozenset({"time_limit"})),
    ("cancelled", "cancelled by a person or the scheduler", frozenset({"cancelled"})),
    ("evidence", "the evidence is missing, changed, unsafe, unreadable or invalid",
     frozenset({"evidence_missing", "evidence_mismatch", "evidence_unsafe",
                "evidence_unreadable", "evidence_invalid", "period_record_unreadable"})),
    ("incomplete", "ended cleanly without proving completion (no terminal event or "
     "completion phase)", frozenset({"terminal_event_missing", "completion_phase_missing"})),
    ("inconsistent", "the evidence does not belong together (identity, timeline, commit, "
     "idle check)", frozenset({"identity_mismatch", "timeline_inconsistent",
                              "commit_mismatch", "idle_check_failed"})),
    ("unfinished", "still pending or running in sacct: wait, do not resubmit",
     frozenset({"array_partial"})),
)
"""(group, what it means, the verdict reasons it holds), in the order printed; an unresolved
reason none names is in ``other``."""

CRASHED = ("crashed", "the trainer itself failed (a crash, an out-of-memory, its own abort): "
           "rerun unchanged, it may fail the same way")
TRAINERS_OWN = frozenset({"python_exception", "segfault", "child_failed", "aborted", "gpu_oom",
                          "host_oom", "nan_loss", "engine_dead"})
"""Causes of an unclean exit that are the trainer's own doing, not the infrastructure's."""


@dataclass(frozen=True, slots=True)
class RerunGroup:
    """One reason group of the plan."""

    group: str
    meaning: str
    reasons: tuple[str, ...]
    task_ids: tuple[int, ...]
    subjects: tuple[str, ...]
    without_task_id: tuple[str, ...] = field(default=())
    cause: str | None = None
    """What ended its periods (one cause a line; None: none named)."""
    array_job_id: str | None = None
    """The job array its task ids are of (None: not recorded)."""

    @property
    def name(self) -> str:
        """``group/cause`` (the group alone without a cause)."""
        return f"{self.group}/{self.cause}" if self.cause and self.cause != self.group \
            else self.group

    @property
    def array(self) -> str:
        """The ``--array=`` value of the group's elements (``""``: none known)."""
        return array_spec(self.task_ids)


def array_spec(task_ids: Iterable[int]) -> str:
    """Array task ids as Slurm's ``--array`` value: sorted, unique, runs as ranges
    (``[3, 7, 12, 13, 14]`` -> ``3,7,12-14``)."""
    ids = sorted(set(task_ids))
    parts: list[str] = []
    start = 0
    for index in range(1, len(ids) + 1):
        if index == len(ids) or ids[index] != ids[index - 1] + 1:
            first, last = ids[start], ids[index - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = index
    return ",".join(parts)


def rerun_plan(out: Path) -> list[RerunGroup]:
    """The plan of the audit in ``out``: one line per reason group, cause and array with
    periods in it (an unclean exit the trainer caused is ``crashed``, not infrastructure)."""
    path = out / "periods.parquet"
    rows = _periods(path, _check_pinned(out, path))
    named = {reason: group for group, _, reasons in GROUPS for reason in reasons}
    members: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for row in rows:
        if row["verdict"] != "unresolved":
            continue
        group = named.get(str(row["reason"]), "other")
        cause = str(row["cause"]) if row.get("cause") is not None else ""
        if group == "infrastructure" and cause in TRAINERS_OWN \
                and row["reason"] != "infrastructure_failure":  # (the report's word stands)
            group = CRASHED[0]
        array = str(row["array_job_id"]) if row.get("array_job_id") is not None else ""
        members.setdefault((group, cause, array), []).append(row)
    order = [*[(g, m) for g, m, _ in GROUPS[:1]], CRASHED, *[(g, m) for g, m, _ in GROUPS[1:]],
             ("other", "unresolved for another reason")]
    plan = []
    for group, meaning in order:
        for (_, cause, array), found in sorted(
                (key, rows) for key, rows in members.items() if key[0] == group):
            found = sorted(found, key=lambda r: str(r["subject"]))
            plan.append(RerunGroup(
                group, meaning, tuple(sorted({str(r["reason"]) for r in found})),
                tuple(sorted({int(str(r["array_task_id"])) for r in found
                              if r["array_task_id"] is not None})),
                tuple(str(r["subject"]) for r in found),
                tuple(str(r["subject"]) for r in found if r["array_task_id"] is None),
                cause or None, array or None))
    return plan


COLUMNS = ("subject", "array_task_id", "verdict", "reason")
"""The columns of ``periods.parquet`` the plan reads."""
LATER_COLUMNS = ("cause", "array_job_id")
"""Columns it reads where an audit wrote them (an older audit's table lacks the array)."""
VERDICTS = frozenset({"resolved", "failed", "unresolved"})


def _periods(path: Path, data: bytes) -> list[dict[str, object]]:
    """The rows (:data:`COLUMNS`) of ``data``, the bytes of ``path``; refused in one line
    when a column is missing or of another type than the audit writes, or a value is not
    one an audit writes (its manifest may pin it: a forger can re-pin what he edits)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from auditor.report.tables import SCHEMAS

    try:
        reader = pq.ParquetFile(pa.BufferReader(data))
        schema = reader.schema_arrow
    except (OSError, pa.ArrowException, UnicodeDecodeError) as error:  # (a name or text
        # not UTF-8: pyarrow decodes it as it reads)
        raise InputError(f"rerun: {path}: unreadable ({_first_line(error)})") from None
    for name in COLUMNS:
        wanted = SCHEMAS["periods"].field(name).type
        found = len(schema.get_all_field_indices(name))
        if found != 1:
            raise InputError(f"rerun: {path}: {'no' if not found else 'more than one'} "
                             f"column {name!r}; is it an audit's periods table?")
        if schema.field(name).type != wanted:
            raise InputError(f"rerun: {path}: column {name!r} is {schema.field(name).type}, "
                             f"not {wanted}; is it an audit's periods table?")
    later = [name for name in LATER_COLUMNS
             if len(schema.get_all_field_indices(name)) == 1
             and schema.field(name).type == SCHEMAS["periods"].field(name).type]
    try:
        rows: list[dict[str, object]] = reader.read(columns=[*COLUMNS, *later]).to_pylist()
    except (OSError, pa.ArrowException, UnicodeDecodeError) as error:
        raise InputError(f"rerun: {path}: unreadable ({_first_line(error)})") from None
    for number, row in enumerate(rows):
        task = row["array_task_id"]
        problem = ("no subject" if row["subject"] is None
                   else f"verdict {row['verdict']!r}" if row["verdict"] not in VERDICTS
                   else "no reason" if row["reason"] is None
                   else f"array_task_id {task}" if isinstance(task, int) and task < 0
                   else None)
        if problem is not None:
            raise InputError(f"rerun: {path}: row {number}: {problem} is not what an audit "
                             "writes; is it an audit's periods table?")
    return rows


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _check_pinned(out: Path, path: Path) -> bytes:
    """The bytes of ``periods.parquet``; refused when its output manifest does not pin them
    as they are."""
    from auditor.report.output import MANIFEST, manifest_outputs

    if not out.is_dir():
        raise UsageError(f"rerun: {out}: not a directory (give an audit's --out)")
    try:
        data = regular_bytes(path, follow=False)
        regular_bytes(out / MANIFEST, read=False, follow=False)
    except FileNotFoundError as error:
        raise UsageError(f"rerun: {error.filename}: not found; is {out} an audit "
                         "output?") from None
    except OSError as error:
        raise InputError(f"rerun: {error.filename}: unreadable ({error.strerror})") from None
    listed = (manifest_outputs(out) or {}).get("periods.parquet")
    if listed != (hashlib.sha256(data).hexdigest(), len(data)):
        raise UsageError(f"rerun: {path}: does not match {out / MANIFEST} (changed since the "
                         f"audit, or no audit's); run 'auditor verify {out}'")
    return data

