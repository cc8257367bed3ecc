"""Writing a study: the sacct dump, attempt directories, period records with their
manifests, and :func:`write_study`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from auditor._studygen.evidence import (
    _device_evidence,
    _log_chunks,
    _trace_chunks,
    _trial_record,
    _write_file,
)
from auditor._studygen.plan import _ElementPlan, _plan, _Run
from auditor._studygen.spec import (
    _STEP_STATE,
    NS,
    PeriodSpec,
    StudySpec,
    _ceil_s,
    _dumps,
    _floor_s,
    _sacct_time,
)
from auditor.model.kinds import (
    ALLOCATOR_TRACE,
    DEVICE_EVIDENCE,
    TRAINING_LOG,
    TRIAL,
    EvidenceKind,
)

# --------------------------------------------------------------------------- sacct


def _tres(gpus: int, *, billing: bool) -> str:
    cpus = 8 * gpus
    parts = [f"billing={cpus}"] if billing else []
    parts += [f"cpu={cpus}", f"gres/gpu:a100={gpus}", f"gres/gpu={gpus}", f"mem={60 * gpus}G"]
    parts.append("node=1")
    return ",".join(parts)


def _sacct_lines(spec: StudySpec, plans: Sequence[_ElementPlan]) -> list[str]:
    rows: list[list[str]] = []
    for plan in sorted(plans, key=lambda item: item.element.array_task_id):
        rows.extend(_element_rows(spec, plan))
    lines = ["|".join(row) for row in rows]
    lines.extend(spec.sacct_extra_lines)
    return lines


def _element_rows(spec: StudySpec, plan: _ElementPlan) -> list[list[str]]:
    """One element's sacct rows: the element, its batch and extern steps, one per attempt."""
    rows: list[list[str]] = []
    element = plan.element
    task = element.array_task_id
    if plan.start_ns is None or plan.end_ns is None:
        rows.append(
            [
                f"{spec.array_job_id}_[{task}]",
                element.job_id,
                spec.job_name,
                plan.state,
                plan.exit_code,
                "Unknown",
                "Unknown",
                "0",
                "",
                "None assigned",
                "Priority",
            ]
        )
        return rows
    start, end = _sacct_time(plan.start_ns), _sacct_time(plan.end_ns)
    elapsed = str((plan.end_ns - plan.start_ns) // NS)
    job, raw = f"{spec.array_job_id}_{task}", element.job_id
    # (an allocation holds at least the GPUs its periods ran on: a multi-node period of
    # more GPUs than ``alloc_gpus`` would contradict its own row, AUD129)
    gpus = max([element.alloc_gpus, *(period.gpus for period in element.periods)])
    batch_state, batch_code = plan.state, plan.exit_code
    if plan.state.startswith(("CANCELLED", "TIMEOUT", "NODE_FAIL")):
        batch_state, batch_code = "CANCELLED", "0:15"
    extern_state, extern_code = "COMPLETED", "0:0"
    if plan.state == "NODE_FAIL":
        extern_state, extern_code = "CANCELLED", "0:15"
    rows.append(
        [
            job,
            raw,
            spec.job_name,
            plan.state,
            plan.exit_code,
            start,
            end,
            elapsed,
            _tres(gpus, billing=True),
            plan.node,
            "None",
        ]
    )
    rows.append(
        [
            f"{job}.batch",
            f"{raw}.batch",
            "batch",
            batch_state,
            batch_code,
            start,
            end,
            elapsed,
            _tres(gpus, billing=False),
            plan.node,
            "",
        ]
    )
    rows.append(
        [
            f"{job}.extern",
            f"{raw}.extern",
            "extern",
            extern_state,
            extern_code,
            start,
            end,
            elapsed,
            _tres(gpus, billing=True),
            plan.node,
            "",
        ]
    )
    for run in plan.runs:
        step_start, step_end = _floor_s(run.started_ns), _ceil_s(run.finished_ns)
        state, code = _STEP_STATE[run.outcome]
        rows.append(
            [
                f"{job}.{run.step_index}",
                f"{raw}.{run.step_index}",
                "apptainer",
                state,
                code,
                _sacct_time(step_start),
                _sacct_time(step_end),
                str((step_end - step_start) // NS),
                _tres(run.period.gpus, billing=False),
                plan.node,
                "",
            ]
        )
    return rows


# --------------------------------------------------------------------------- writing


def _write_attempt(
    run: _Run, root: Path, spec: StudySpec
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Write one attempt directory; return its (workers, evidence) manifest entries."""
    base = root / run.attempt_dir
    evidence: list[dict[str, Any]] = []

    def put(kind: EvidenceKind, chunks: Iterable[bytes], **name: object) -> None:
        relative = kind.path_for(**name)
        digest, size = _write_file(base / relative, chunks)
        evidence.append({"path": relative, "kind": kind.name, "sha256": digest, "size": size})

    if run.outcome != "node_failure":
        put(TRIAL, [_dumps(_trial_record(run))], job=run.job_id)
    put(TRAINING_LOG, _log_chunks(run, spec.log_filler_lines, spec), job=run.job_id)
    for rank, pid in enumerate(run.worker_pids):
        put(ALLOCATOR_TRACE, _trace_chunks(run, rank, spec.trace_samples), pid=pid)
    for rank, pid in enumerate(run.worker_pids):
        put(DEVICE_EVIDENCE, [_dumps(_device_evidence(run, rank))], role="actor_rollout",
            rank=rank, pid=pid)
    workers = [
        {"role": "actor_rollout", "rank": rank, "pid": pid}
        for rank, pid in enumerate(run.worker_pids)
    ]
    return workers, evidence


def _idle_check(run: _Run) -> dict[str, Any] | None:
    if run.outcome == "node_failure":
        return None
    return {
        "passed": True,
        "checked_ns": run.idle_check_ns,
        "gpu_memory_used_mib": [0] * run.element.alloc_gpus,
        "gpu_processes": 0,
    }


def _period_record(
    spec: StudySpec,
    period: PeriodSpec,
    runs: Sequence[_Run],
    written: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]],
) -> dict[str, Any]:
    first = runs[0]
    record: dict[str, Any] = {
        "schema": "run-evidence/period/v1",
        "study": spec.study,
        "pair": period.pair,
        "workload": period.workload,
        "seed": period.seed,
        "model": period.model,
        "period": period.period,
        "gpus": period.gpus,
        "array_job_id": spec.array_job_id,
    }
    if len(runs) == 1 and period.outcome != "retried":
        workers, evidence = written[id(first)]
        record.update(
            {
                "array_task_id": first.element.array_task_id,
                "job_id": first.job_id,
                "attempt_dir": first.attempt_dir,
                "commit": spec.commit,
                "workers": workers,
                "evidence": evidence,
            }
        )
    else:
        record["commit"] = spec.commit
        attempts = []
        for run in runs:
            workers, evidence = written[id(run)]
            entry: dict[str, Any] = {
                "job_id": run.job_id,
                "array_task_id": run.element.array_task_id,
                "attempt_dir": run.attempt_dir,
                "workers": workers,
                "evidence": evidence,
            }
            check = _idle_check(run)
            if check is not None:
                entry["idle_check"] = check
            attempts.append(entry)
        record["attempts"] = attempts
    check = _idle_check(runs[-1])
    if check is not None:
        record["idle_check"] = check
    return record


def write_study(spec: StudySpec, root: Path) -> Path:
    """Write ``spec`` as a study under ``root`` (which must not exist or be empty).

    Returns ``root``. Raises ``FileExistsError`` for a non-empty root and ``ValueError``
    for a spec whose times or identities do not fit together.
    """
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"refusing to write into non-empty {root}")
    plans = _plan(spec)
    root.mkdir(parents=True, exist_ok=True)

    protocol = dict(spec.protocol) if spec.protocol is not None else None
    if spec.protocol_inputs:
        anchors = {}
        for name, data in sorted(spec.protocol_inputs.items()):
            digest, _ = _write_file(root / "protocol-inputs" / name, [data])
            anchors[name] = digest
        if protocol is not None:
            protocol["anchors"] = anchors
    if protocol is not None:
        _write_file(root / "protocol.json", [_dumps(protocol)])
    if spec.execution_commits is not None:
        commits = orjson.dumps(
            spec.execution_commits, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
        )
        _write_file(root / "execution_commits.json", [commits + b"\n"])
    sacct = "".join(line + "\n" for line in _sacct_lines(spec, plans))
    _write_file(root / "accounting" / "sacct-raw.psv", [sacct.encode()])

    written: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    by_period: dict[int, list[_Run]] = {}
    order: list[PeriodSpec] = []
    for plan in plans:
        for run in plan.runs:
            written[id(run)] = _write_attempt(run, root, spec)
            if id(run.period) not in by_period:
                order.append(run.period)
            by_period.setdefault(id(run.period), []).append(run)
    seen: set[tuple[str, int]] = set()
    for period in order:
        key = (period.pair, period.period)
        if key in seen:
            raise ValueError(f"{period.pair} period {period.period} is described twice")
        seen.add(key)
        runs = sorted(by_period[id(period)], key=lambda run: run.attempt_number)
        record = _period_record(spec, period, runs, written)
        _write_file(root / "pairs" / period.pair / f"period-{period.period}.json", [_dumps(record)])
    return root
