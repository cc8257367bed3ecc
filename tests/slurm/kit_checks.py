"""What the audit must say about the producer kit's array (``tests/slurm/kit.py``), checked
on the live run (``test_kit_cluster.py``) and on its saved copy (``test_kit_saved.py``).

:class:`KitVerdicts` holds the checks; each test module subclasses it (as ``Test...``) and
provides an ``audited`` fixture: an :class:`Audited`, one audit of the study through
``auditor._cli.main(["audit", root, "--out", out, ...])``, either with the study's own
``accounting/sacct-raw.psv`` (``sacct -D``) or with the contract's dump (no ``-D``) passed as
``--sacct``. The expectations are what the harness did (see :data:`tests.slurm.kit.ELEMENTS`)
and what sacct printed for it, never the audit's own output read back. Where the audit is
wrong today, the check is a separate small test marked ``xfail(strict=True)`` naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from auditor._cli import main
from tests.slurm.kit import ABSENT_JOB, COMMIT, GPUS, pair_of

__all__ = ["SACCT", "VERDICTS", "Audited", "KitVerdicts", "audit", "elements", "records"]

SACCT: dict[int, tuple[str, str, str, str]] = {
    # task: (State, ExitCode, .batch State, .batch ExitCode) of the latest record
    0: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    1: ("FAILED", "1:0", "FAILED", "1:0"),
    2: ("FAILED", "1:0", "FAILED", "1:0"),
    3: ("COMPLETED", "0:0", "COMPLETED", "0:0"),        # auditor run exits 0
    4: ("FAILED", "15:0", "FAILED", "15:0"),            # 143 passed on, minus 128
    5: ("CANCELLED by 0", "0:0", "FAILED", "15:0"),     # the script exits auditor run's 143
    6: ("TIMEOUT", "0:0", "FAILED", "15:0"),
    7: ("FAILED", "10:0", "FAILED", "10:0"),            # 138 (SIGUSR1), minus 128
    8: ("COMPLETED", "0:0", "COMPLETED", "0:0"),        # the rerun; -D: REQUEUED first
    9: ("FAILED", "9:0", "FAILED", "9:0"),              # 137, minus 128
    10: ("FAILED", "127:0", "FAILED", "127:0"),         # 255, minus 128
    12: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
}
"""What sacct prints for each element that ran (11, cancelled while pending, has no row)."""

VERDICTS: dict[int, tuple[str, str]] = {
    0: ("resolved", "completed"),
    1: ("unresolved", "unclean_exit"),
    2: ("failed", "eligible_failure"),
    3: ("resolved", "completed"),
    4: ("unresolved", "killed"),          # the controller's own SIGTERM, the flag off
    5: ("unresolved", "cancelled"),
    6: ("unresolved", "time_limit"),      # SIGTERM received; sacct TIMEOUT says whose
    7: ("unresolved", "time_limit"),      # the pre-timeout SIGUSR1
    8: ("resolved", "completed"),         # the rerun completed
    9: ("unresolved", "killed"),
    10: ("unresolved", "unclean_exit"),   # exit 255 is no signal (xfail today)
    12: ("resolved", "completed"),
}
"""The correct verdict and reason of each element's period (11: see the absent-element
checks)."""

FIXED_LATER = {10}
"""Elements whose verdict is asserted only in their own xfail tests."""

INCLUDED = {"completed@2", "coordinated-on@2", "oom@2", "throttled@2", "pending-cancelled@2",
            "requeue@2"}
"""The configurations that resolve. The
pending-cancelled element's period resolves on its own evidence (a completed example run
under a job sacct never showed, AUD119); the gate still fails on AUD126."""


@dataclass
class Audited:
    """One audit of the kit study and what it rests on."""

    array: str
    root: Path
    """The study."""
    dumps: dict[str, str]
    """``contract`` and ``contract-D``: sacct's verbatim output."""
    dump: str
    """Which dump the audit read: ``contract-D`` (the study's own) or ``contract``."""
    summary: dict[str, Any]
    findings: list[dict[str, Any]]
    diagnostic: str
    periods: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Array task -> its ``summary.json`` period."""


def audit(root: Path, out: Path, array: str, dumps: dict[str, str], dump: str,
          capsys: pytest.CaptureFixture[str] | None = None) -> Audited:
    """Audit ``root`` into ``out`` through the CLI, with the study's dump (``contract-D``)
    or with the contract's (``contract``, written beside ``out`` and passed as --sacct)."""
    extra: list[str] = []
    if dump == "contract":
        path = out.parent / f"{out.name}-contract.psv"
        path.write_text(dumps["contract"])
        extra = ["--sacct", str(path)]
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots", *extra]) == 0
    if capsys is not None:
        capsys.readouterr()
    summary = orjson.loads((out / "summary.json").read_bytes())
    findings = pq.read_table(out / "findings.parquet",
                             columns=["rule_id", "subject", "message"]).to_pylist()
    audited = Audited(array, root, dumps, dump, summary, findings,
                      (out / "diagnostic.md").read_text())
    by_pair = {period["pair"]: period for period in summary["periods"]}
    audited.periods = {task: by_pair[pair_of(task)] for task in [*SACCT, 11]
                       if pair_of(task) in by_pair}
    return audited


def rows(text: str) -> list[list[str]]:
    """sacct -P lines split on ``|`` (no value here holds it)."""
    return [line.split("|") for line in text.splitlines() if line]


def records(text: str, array: str, task: int) -> list[list[str]]:
    """The allocation records of ``<array>_<task>``, in dump order."""
    return [row for row in rows(text) if row[0] == f"{array}_{task}"]


def elements(text: str, array: str) -> list[list[str]]:
    """Every allocation record of an array element (no steps, no pending ranges)."""
    return [row for row in rows(text) if "." not in row[0] and "[" not in row[0]
            and row[0].startswith(f"{array}_")]


def rules_of(audited: Audited, subject: str) -> dict[str, list[str]]:
    """Rule id -> the messages of the findings about ``subject``."""
    found: dict[str, list[str]] = {}
    for item in audited.findings:
        if item["subject"] == subject:
            found.setdefault(item["rule_id"], []).append(item["message"])
    return found


def subject(task: int) -> str:
    return f"{pair_of(task)}/period-1"


class KitVerdicts:
    """The checks; a test module subclasses this and defines the ``audited`` fixture."""

    def test_sacct_recorded_each_ending(self, audited: Audited) -> None:
        final = audited.dumps["contract"]
        for task, (state, code, batch_state, batch_code) in SACCT.items():
            latest = records(final, audited.array, task)
            assert [(row[3], row[4]) for row in latest] == [(state, code)], task
            batch = [row for row in rows(final) if row[0] == f"{audited.array}_{task}.batch"]
            assert (batch[-1][3], batch[-1][4]) == (batch_state, batch_code), task
            assert f"gres/gpu={GPUS}" in latest[0][8], task
        assert not records(final, audited.array, 11)           # cancelled while pending
        assert not [row for row in rows(final) if "[" in row[0]]  # and no range left
        history = records(audited.dumps["contract-D"], audited.array, 8)
        assert [row[3] for row in history] == ["REQUEUED", "COMPLETED"]
        assert history[0][1] == history[1][1]                  # one JobIDRaw, two records
        limit = records(final, audited.array, 6)[0]
        assert 60 <= int(limit[7]) <= 100, limit               # the one-minute limit fired
        warned = records(final, audited.array, 7)[0]
        assert int(warned[7]) < 60, warned                     # USR1 came before it

    def test_every_period_is_audited(self, audited: Audited) -> None:
        assert set(audited.periods) == {*SACCT, 11}
        assert audited.summary["launches"] == 14               # 13 periods, 8 ran twice
        for task, period in audited.periods.items():
            assert period["gpus"] == GPUS, task

    def test_the_requeued_period_holds_both_attempts(self, audited: Audited) -> None:
        """``auditor seal`` after each run of element 8: restart 0 in ``attempt-<job>``,
        restart 1 in ``attempt-<job>-r1``, one job id."""
        record = orjson.loads((audited.root / "pairs" / pair_of(8) / "period-1.json")
                              .read_bytes())
        job = records(audited.dumps["contract"], audited.array, 8)[0][1]
        assert [(a["job_id"], a["restart_count"], a["attempt_dir"])
                for a in record["attempts"]] == [
            (job, 0, f"{pair_of(8)}-{GPUS}gpu/attempt-{job}"),
            (job, 1, f"{pair_of(8)}-{GPUS}gpu/attempt-{job}-r1")]
        first, second = (orjson.loads((audited.root / a["attempt_dir"] / f"trial-{job}.json")
                                      .read_bytes()) for a in record["attempts"])
        assert first["invocation"]["received_signal"] == "SIGTERM"
        assert (second["invocation"]["received_signal"], second["invocation"]["exit_code"]) == (
            None, 0)
        assert record["commit"] == COMMIT and record["array_task_id"] == 8
        assert record["idle_check"]["passed"] is None      # no NVML: "not made"

    def test_verdicts_and_reasons(self, audited: Audited) -> None:
        seen = {task: (period["verdict"], period["reason"])
                for task, period in audited.periods.items()
                if task in VERDICTS and task not in FIXED_LATER}
        assert seen == {task: VERDICTS[task] for task in seen}
        assert len(seen) == len(VERDICTS) - len(FIXED_LATER)

    def test_the_diagnosis_cites_what_ended_each(self, audited: Audited) -> None:
        def said(task: int, rule: str, *words: str) -> None:
            messages = rules_of(audited, subject(task)).get(rule, [])
            assert any(all(word in message for word in words) for message in messages), (
                task, rule, words, rules_of(audited, subject(task)))

        said(2, "AUD203", "rollout_init", "torch.OutOfMemoryError")
        said(3, "AUD205", "coordinated shutdown", "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS=1")
        said(4, "AUD204", "143", "off")
        said(5, "AUD206", "SIGTERM")
        said(6, "AUD207", "SIGTERM", "TIMEOUT")
        said(7, "AUD207", "SIGUSR1")
        said(9, "AUD204", "137", "SIGKILL")

    def test_report_says_the_exit_code_may_have_lost_128(self, audited: Audited) -> None:
        """sacct's 15:0, 10:0, 9:0 and 127:0 may be the attempts' 143, 138, 137 and 255."""
        for printed, code in (("15:0", 143), ("10:0", 138), ("9:0", 137), ("127:0", 255)):
            assert f"`{printed}` may be the attempt's {code}" in audited.diagnostic, printed

    def test_the_element_cancelled_while_pending_is_named(self, audited: Audited) -> None:
        """Its period record names task 11 of the array; sacct never showed it: AUD126,
        whose message says both causes, and the gate fails on it."""
        messages = rules_of(audited, f"{audited.array}_11").get("AUD126", [])
        assert len(messages) == 1, audited.findings
        assert "pending" in messages[0] and "account" in messages[0], messages
        assert any(f"job {ABSENT_JOB} has no allocation row" in message
                   for message in rules_of(audited, subject(11)).get("AUD119", []))
        assert audited.summary["accounting"]["jobs_without_element"] == [ABSENT_JOB]
        assert any(f"{audited.array}_11" in reason
                   for reason in audited.summary["gate"]["reasons"]), audited.summary["gate"]

    def test_gate(self, audited: Audited) -> None:
        gate, partial = audited.summary["gate"], audited.summary["gate_allow_partial"]
        assert gate["passed"] is False
        assert partial["passed"] is False            # the absent element fails it too
        for name in ("crash", "cancelled", "time-limit", "pre-timeout", "sigkill",
                     "coordinated-off", "exit-255"):
            assert any(reason.startswith(f"configuration {name}@2 unresolved")
                       for reason in gate["reasons"]), name
        # (contract v1.2: a failing --allow-partial gate admits nothing; the resolved
        # configurations are still named as such)
        assert gate["included_configurations"] == partial["included_configurations"] == []
        assert _resolved(audited) == INCLUDED
        assert audited.summary["configurations_total"] == 13

    def test_allocation_scope(self, audited: Audited) -> None:
        """Sum of ElapsedRaw x GPUs over every record of every element in the dump read:
        with -D the requeued element's first record too, named as lost to requeue."""
        every = elements(audited.dumps[audited.dump], audited.array)
        accounting = audited.summary["accounting"]
        assert accounting["allocation_gpu_seconds"] == sum(int(row[7]) * GPUS for row in every)
        if audited.dump == "contract-D":
            first = records(audited.dumps["contract-D"], audited.array, 8)[0]
            assert first[3] == "REQUEUED"
            assert accounting["requeued_gpu_seconds"] == int(first[7]) * GPUS
        assert accounting["scopes_overlap"] is True
        assert accounting["wasted_gpu_seconds"] == 0       # no retry after a completion

    def test_the_requeued_period(self, audited: Audited) -> None:
        """Its second attempt's directory (``-r1``) is its own job's, and each attempt is
        checked against its own record (no AUD111, no AUD117)."""
        found = rules_of(audited, subject(8))
        assert "AUD111" not in found and "AUD117" not in found, found
        assert "requeue@2" in _resolved(audited)

    # ------------------------------------------------------- wrong today (the fixes' spec)

    def test_exit_255_is_no_signal(self, audited: Audited) -> None:
        period = audited.periods[10]
        assert (period["verdict"], period["reason"]) == VERDICTS[10]
        assert period["cause"] != "signal"
        assert not any("signal 127" in message
                       for messages in rules_of(audited, subject(10)).values()
                       for message in messages)


def _resolved(audited: Audited) -> set[str]:
    """The configurations the audit resolved (``workload@gpus``)."""
    return {f"{c['workload']}@{c['gpus']}" for c in audited.summary["configurations"]
            if c["status"] == "resolved"}
