"""The one place the stages meet: collect -> validate -> reason.

:meth:`Auditor.run` is a generator: it yields :class:`~auditor.model.Progress` events while
it works (the CLI turns them into a progress bar) and returns the
:class:`~auditor.model.AuditResult` (``result = yield from auditor.run()``, or use
:func:`run_audit`). Nothing here prints, and nothing is written anywhere: reporters are
pure functions of the result. Each step is a stage's function; this module only orders
them, and sends the reading to the pool (:mod:`auditor._pool`).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from auditor._io import clip
from auditor._pool import make_pool
from auditor.catalogue import finding
from auditor.collect.attempt import hash_only, read_attempt
from auditor.collect.discover import SACCT_PATH, discover, find_period_records
from auditor.collect.inputs import (
    load_period,
    read_commits,
    read_input,
    read_protocol_inputs,
    read_sacct,
)
from auditor.collect.plan import plan_reads, plan_unlisted
from auditor.collect.protocol import read_protocol
from auditor.errors import UsageError
from auditor.model import (
    DEFAULT_PROTOCOL,
    AttemptRead,
    AuditOptions,
    AuditResult,
    Citation,
    Collected,
    EvidenceFile,
    FileOutcome,
    Finding,
    InputFile,
    PeriodEvidence,
    PeriodRecord,
    Progress,
    Protocol,
    StudyLayout,
)
from auditor.reason.engine import reason
from auditor.validate.checks import validate
from auditor.validate.integrity import (
    assemble,
    integrity_findings,
    layout_findings,
    unlisted_rows,
)

CAP_SUMMARIES = frozenset({"AUD013", "AUD016"})
"""Findings that report a cap: never dropped by the per-file cap (the study's counts them)."""
R = TypeVar("R")


class Auditor:
    """Audits one study root."""

    def __init__(self, root: Path | str, options: AuditOptions | None = None) -> None:
        self.root_arg = Path(root)
        self.options = options or AuditOptions()
        self._pool = make_pool(self.options)

    def run(self) -> Generator[Progress, None, AuditResult]:
        """Collect, validate and reason; yields progress, returns the result.

        Drive it inside :func:`paused_gc` (:func:`run_audit` and the command line do):
        the generator itself leaves the collector alone, so one that is abandoned
        half-way can never leave it switched off."""
        try:
            collected = yield from self._collect()
        finally:
            self._pool.close()
        yield Progress("validate", 0, 1)
        validation = validate(collected, self.options)
        yield Progress("reason", 0, 1)
        reasoning = reason(collected, validation, self.options)
        findings, not_kept = apply_limits(
            [*collected.findings, *validation, *reasoning.findings], self.options)
        # ...and those a collector counted as it read (a trace of a million bad lines)
        not_kept += sum(int(item.value("dropped", 0)) for item in collected.findings
                        if item.rule_id == "AUD013")
        return AuditResult(
            collected=collected,
            findings=findings,
            verdicts=reasoning.verdicts,
            reasoning=reasoning,
            options=self.options,
            partial=any(f.rule_id in CAP_SUMMARIES for f in findings),
            findings_not_kept=not_kept,
        )

    def _collect(self) -> Generator[Progress, None, Collected]:
        """Read the study's inputs and period records, then every attempt's evidence."""
        root = _resolve_root(self.root_arg)
        regular: set[str] = set()
        period_paths = find_period_records(root, regular)
        if not period_paths[0]:
            raise UsageError(
                f"{self.root_arg}: no period records (pairs/<pair>/period-<n>.json) found; "
                "is this a study root?"
            )
        # The scheduler's dump and the period records are sent to the pool first: it
        # parses and reads them while this process walks the attempt directories.
        period_tasks = [(str(root), rel, rel in regular) for rel in period_paths[0]]
        sacct_rel = SACCT_PATH if os.path.lexists(root / SACCT_PATH) else None
        sacct_read = self._pool.soon(read_sacct, (root, sacct_rel, self.options),
                                     len(period_tasks))
        loaded = self._pool.map(load_period, period_tasks, 0)
        layout = yield from discover(root, period_paths)
        findings: list[Finding] = []
        inputs: list[InputFile] = []
        protocol = DEFAULT_PROTOCOL
        if layout.protocol:
            given = read_input(root, layout.protocol, read_protocol, inputs, findings)
            if given is not None:
                protocol = given
                findings.extend(given.findings)
        commits = read_commits(root, layout.execution_commits, inputs, findings)
        sacct, sacct_display, sacct_inputs, sacct_findings = sacct_read()
        inputs.extend(sacct_inputs)
        findings.extend(sacct_findings)
        periods: list[PeriodRecord] = []
        yield Progress("periods", 0, len(period_tasks))
        for period, loaded_input, problems in loaded:
            periods.append(period)
            findings.extend(problems)
            findings.extend(period.findings)
            if loaded_input is not None:
                inputs.append(loaded_input)
            yield Progress("periods", len(periods), len(period_tasks))
        layout, period_evidence, evidence, read_findings = yield from self._read_evidence(
            root, layout, periods, protocol)
        findings.extend(read_findings)
        read_protocol_inputs(self.options, inputs, findings)
        return Collected(
            root=root,
            layout=layout,
            protocol=protocol,
            sacct=sacct,
            sacct_display=sacct_display,
            execution_commits=commits,
            periods=tuple(period_evidence),
            evidence=tuple(sorted(evidence, key=lambda e: e.path)),
            inputs=tuple(sorted(inputs, key=_input_order)),
            findings=tuple(findings),
        )

    def _read_evidence(
        self, root: Path, layout: StudyLayout, periods: list[PeriodRecord], protocol: Protocol
    ) -> Generator[
        Progress, None,
        tuple[StudyLayout, list[PeriodEvidence], list[EvidenceFile], list[Finding]],
    ]:
        """Plan, read and hash every evidence file, then join what was read with the
        manifests: the layout (its listings let go), the periods with their evidence, every
        evidence row, and the findings of reading and of integrity."""
        tasks, pre = plan_reads(root, periods, protocol, layout.regular_files)
        unlisted, unlisted_blocked = plan_unlisted(root, layout, periods)
        total_files = sum(len(t.files) for t in tasks) + len(unlisted)
        total_bytes = sum(entry.size or 0 for record in periods for spec in record.attempts
                          for entry in spec.evidence)
        # The inventory served planning: it goes before the reads bring their results in
        # (with it, and each file's path sent once, the reading's peak on 144k files fell
        # from 541 to 447 MB).
        layout = replace(layout, attempt_files={}, regular_files=frozenset())
        reading = self._pool.map(read_attempt, tasks, total_bytes)
        del tasks  # (a pool holds each chunk's tasks until it is read)
        yield Progress("read", 0, total_files)
        reads: dict[str, AttemptRead] = {}
        done = 0
        read_bytes = 0
        for read in reading:
            reads[read.key] = read
            done += len(read.files)
            read_bytes += read.bytes_read
            yield Progress("read", done, total_files, read_bytes)
        unlisted_outcomes: list[FileOutcome] = list(unlisted_blocked)
        for outcome in self._pool.map(hash_only, unlisted, total_bytes):
            unlisted_outcomes.append(outcome)
            done += 1
            read_bytes += outcome.digest.size if outcome.digest else 0
            yield Progress("read", done, total_files, read_bytes)

        period_evidence, evidence = assemble(periods, pre, reads)
        evidence.extend(unlisted_rows(unlisted_outcomes))
        findings = [item for pe in period_evidence for attempt in pe.attempts
                    for item in attempt.read.findings]
        findings.extend(integrity_findings(evidence))
        findings.extend(layout_findings(root, layout, period_evidence))
        return layout, period_evidence, evidence, findings


def apply_limits(findings: list[Finding], options: AuditOptions) -> tuple[tuple[Finding, ...],
                                                                         int]:
    """Cap findings per cited file and in all, clip quotes: (the findings kept, how many
    were counted but not kept). Each cap reached is summed up in an ``AUD013``: a file's
    among the warnings, the study's (at most ``max_findings`` kept before it) last."""
    per_file: Counter[str] = Counter()
    dropped_per_file: Counter[str] = Counter()
    kept: list[Finding] = []
    order = {"error": 0, "warning": 1, "info": 2}
    for item in sorted(findings, key=lambda f: order[f.severity.value]):
        path = item.citations[0].path if item.citations else item.subject
        if item.rule_id not in CAP_SUMMARIES and per_file[path] >= options.max_findings_per_file:
            dropped_per_file[path] += 1
            continue
        per_file[path] += 1
        if any(len(c.quote) > options.max_quote for c in item.citations):
            item = replace(item, citations=tuple(
                replace(c, quote=clip(c.quote, options.max_quote)) for c in item.citations))
        kept.append(item)
    # each file's cap summed up among the warnings (the study's cap may cut them too: one a
    # file, they could be thousands)
    kept = sorted([*kept, *(finding("AUD013", path, [Citation(path)], dropped=dropped,
                                    cap=options.max_findings_per_file)
                            for path, dropped in sorted(dropped_per_file.items()))],
                  key=lambda f: order[f.severity.value])
    not_kept = sum(dropped_per_file.values())
    if len(kept) > options.max_findings:
        dropped = len(kept) - options.max_findings
        kept = kept[: options.max_findings]
        kept.append(finding("AUD013", "study", [], path="all files", dropped=dropped,
                            cap=options.max_findings))
        not_kept += dropped
    return tuple(kept), not_kept


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block.

    An audit builds millions of small records that hold no reference cycles and
    live until the report is written; each collection re-scans them (about 10% of
    the time of a many-file study, measured with ``gc.callbacks``) yet can free
    nothing. Reference counting still frees everything as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_audit(root: Path | str, options: AuditOptions | None = None) -> AuditResult:
    """Run an audit to completion, ignoring progress."""
    with paused_gc():
        return drive(Auditor(root, options).run(), lambda event: None)


def drive(generator: Generator[Progress, None, R], show: Callable[[Progress], None]) -> R:
    """Run ``generator`` (:meth:`Auditor.run`) to its end, passing each event it yields to
    ``show``; what it returns."""
    while True:
        try:
            event = next(generator)
        except StopIteration as stop:
            result: R = stop.value
            return result
        show(event)


def _input_order(item: InputFile) -> tuple[str, str]:
    return item.group, item.path


def _resolve_root(root: Path) -> Path:
    if not root.exists():
        raise UsageError(f"{root}: evidence root does not exist")
    if not root.is_dir():
        raise UsageError(f"{root}: evidence root is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise UsageError(f"{root}: evidence root cannot be read")
    return root.resolve()
