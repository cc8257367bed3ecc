"""Integrity: compare every file read with its manifest entry, and say what is wrong.

:func:`assemble` joins each attempt's manifest with what reading its files gave (one
evidence row per file: verified, mismatched, missing, unsafe, unreadable or unlisted);
:func:`integrity_findings` and :func:`layout_findings` turn rows and the study's layout into
findings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from auditor.collect.discover import unlistable_reason
from auditor.collect.inputs import pair_link_hides_periods
from auditor.collect.plan import evidence_row
from auditor.model import (
    AttemptEvidence,
    AttemptRead,
    Citation,
    EvidenceFile,
    FileDigest,
    FileOutcome,
    Finding,
    PeriodEvidence,
    PeriodRecord,
    StudyLayout,
)
from auditor.model.paths import join_text
from auditor.rules import finding

_HEX64 = re.compile(r"[0-9a-f]{64}")
"""A SHA-256 as a manifest must give it (lower-cased when read)."""


def assemble(
    periods: list[PeriodRecord],
    pre: dict[str, list[EvidenceFile]],
    reads: dict[str, AttemptRead],
    position: int | None = None,
) -> tuple[list[PeriodEvidence], list[EvidenceFile]]:
    """Each period with its attempts' evidence rows, and every row (``pre``: the rows the
    plan decided; ``reads``: what reading each attempt gave, by its key, with the record's
    ``position`` when the plan gave one)."""
    evidence: list[EvidenceFile] = []
    period_evidence: list[PeriodEvidence] = []
    for record in periods:
        attempts = []
        for spec in record.attempts:
            key = record.attempt_key(spec.index, position)
            read = reads[key]
            outcomes = {o.display: o for o in read.files}
            rows = list(pre[key])
            decided = {r.path for r in rows}
            for entry in spec.evidence:
                display = join_text(spec.attempt_dir or "", entry.path)
                if display is None or display in decided:
                    continue
                outcome = outcomes.get(display)
                if outcome is None:
                    continue
                if outcome.digest is None:
                    rows.append(evidence_row(record, spec, entry, outcome.display, "unreadable",
                                     outcome.error))
                    continue
                status, detail = compare(entry.sha256, entry.size, outcome.digest)
                # the outcome's own string: one copy of each path kept, not two
                rows.append(evidence_row(record, spec, entry, outcome.display, status, detail,
                                 outcome.digest))
            evidence.extend(rows)
            # the file outcomes now live in the rows: keep them once
            attempts.append(AttemptEvidence(
                record.subject, spec, replace(read, files=()),
                tuple(rows),
            ))
        period_evidence.append(PeriodEvidence(record, tuple(attempts)))
    return period_evidence, evidence


def compare(sha256: str | None, size: int | None, digest: FileDigest) -> tuple[str, str]:
    """``verified`` or ``mismatched`` (with what differs) for a file's digest."""
    problems = []
    if size is not None and size != digest.size:
        problems.append(f"size {size} != {digest.size}")
    if sha256 is None or sha256.lower() != digest.sha256:
        problems.append("sha256")
    if size is None:
        problems.append("size not listed")
    return ("verified", "") if not problems else ("mismatched", ", ".join(problems))


def integrity_findings(evidence: Iterable[EvidenceFile]) -> list[Finding]:
    """A finding for every row that is not verified (``AUD101`` to ``AUD105``)."""
    out = []
    for ef in evidence:
        if ef.status == "verified":  # (nearly every row: no citation made for it)
            continue
        cite = [Citation(ef.path)]
        if ef.status == "missing":
            out.append(finding("AUD101", ef.path, cite, manifest=ef.manifest))
        elif ef.status == "mismatched":
            what = "size" if "size" in ef.detail and "sha256" not in ef.detail else "SHA-256"
            if "size" in ef.detail and "sha256" in ef.detail:
                what = "SHA-256 and size"
            expected = f"{(ef.expected_sha256 or '-')[:12]}…/{ef.expected_size}"
            if ef.expected_sha256 is not None and not _HEX64.fullmatch(ef.expected_sha256):
                expected += ", which is not 64 hex digits"  # (a "sha256:" prefix, a typo)
            out.append(finding(
                "AUD102", ef.path, cite, what=what, manifest=ef.manifest, expected=expected,
                actual=f"{(ef.actual_sha256 or '-')[:12]}…/{ef.actual_size}",
            ))
        elif ef.status == "unsafe":
            out.append(finding("AUD103", ef.path, [Citation(ef.manifest)], why=ef.detail,
                               manifest=ef.manifest, path=ef.path))
        elif ef.status == "unreadable":
            out.append(finding("AUD104", ef.path, cite, why=ef.detail))
        elif ef.status == "unlisted":
            out.append(finding("AUD105", ef.path, cite))
    return out


def unlisted_rows(outcomes: Iterable[FileOutcome]) -> list[EvidenceFile]:
    """The evidence rows of files that no period record lists (no pair: the folder above an
    attempt is none, and a pair no record names is no pair of the study's)."""
    return [EvidenceFile(
        outcome.display, "other", "", None, None, None, "", None,
        None, outcome.digest.sha256 if outcome.digest else None,
        outcome.digest.size if outcome.digest else None, "unlisted", outcome.error,
    ) for outcome in outcomes]


def layout_findings(root: Path, layout: StudyLayout,
                    records: Iterable[PeriodRecord]) -> list[Finding]:
    """What the study's layout shows: links in a pair directory's place (``AUD022``), a
    directory under ``pairs/`` that cannot be listed (``AUD025``), files
    under ``pairs/`` that are not period records (``AUD105``), attempt directories no
    period record (``records``) names, and links in an arm's or attempt's place
    (``AUD106``)."""
    findings: list[Finding] = []
    for rel in layout.stray_pair_files:
        if rel.count("/") == 1 and os.path.islink(root / rel) \
                and pair_link_hides_periods(root, rel):
            findings.append(finding("AUD022", rel, [Citation(rel)]))
            continue
        if rel.count("/") <= 1 and not os.path.islink(root / rel) \
                and os.path.isdir(root / rel) \
                and (error := unlistable_reason(root / rel)) is not None:
            # (pairs/ or a pair folder: below one, no period record can be; a folder there
            # that cannot be listed is a stray entry, as any other)
            findings.append(finding("AUD025", rel, [Citation(rel)], error=error))
            continue
        findings.append(finding(
            "AUD105", rel, [Citation(rel)],
            form="stray_in_pairs"))
    referenced = {spec.attempt_dir for record in records for spec in record.attempts}
    for rel_dir in layout.attempt_dirs:
        if rel_dir not in referenced:
            findings.append(finding("AUD106", rel_dir, [Citation(rel_dir)]))
    for rel in layout.linked_dirs:  # (a record naming one finds its files unsafe: said there)
        if not any(ref == rel or (ref or "").startswith(f"{rel}/") for ref in referenced):
            findings.append(finding("AUD106", rel, [Citation(rel)], form="link"))
    return findings
