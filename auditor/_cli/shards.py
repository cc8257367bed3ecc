"""Sharded audits: ``auditor audit ROOT --shard I/N --out PART`` and ``auditor merge``.

A SLURM array of audits covers a study: element I audits every N-th period from the I-th
into a part (the reading, the expensive half: every byte hashed and parsed); ``auditor merge
PART... --out DIR`` verifies every part, refuses parts of different studies, protocols,
inputs, options or versions and a set of shards with one missing or repeated, then runs
the study-level half (cross-checks, verdicts, configurations, accounting, the gate) and
writes the report: byte for byte what one ``auditor audit`` of the study writes with the
same options (the output manifest's time aside).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.errors import InputError, UsageError
from auditor.model import AuditOptions, CollectedParts

if TYPE_CHECKING:
    from auditor.pipeline.parts import Trust

_SHARD = re.compile(r"^([0-9]+)/([0-9]+)$")


def add_parsers(commands: Any) -> None:
    """Add the ``merge`` sub-command to ``commands`` (an argparse sub-parsers action)."""
    merge = commands.add_parser(
        "merge", help="merge the parts of a sharded audit into one audit's outputs",
        description="Verify the parts 'auditor audit ROOT --shard I/N --out PART' wrote and "
        "write the study's audit from them, as one 'auditor audit' would.")
    merge.add_argument("parts", type=Path, nargs="+", metavar="PART",
                       help="the output directories of every shard 1..N")
    merge.add_argument("--out", type=Path, required=True, help="the audit's output directory")
    merge.add_argument("--force", action="store_true",
                       help="replace an earlier audit's output directory, whole")
    merge.add_argument("--waive", action="append", default=[], metavar="RULE_ID:SUBJECT",
                       help="waive a gate reason (needs a matching --reason)")
    merge.add_argument("--reason", action="append", default=[], metavar="TEXT",
                       help="why the preceding --waive is acceptable")
    merge.add_argument("--anchor", action="append", default=[], metavar="NAME=SHA256",
                       help="expected SHA-256 of a protocol input the shards hashed")
    merge.add_argument("--max-findings", type=int, default=10_000)
    merge.add_argument("--max-findings-per-file", type=int, default=200)
    merge.add_argument("--max-quote", type=int, default=300)
    merge.add_argument("--trust-inputs", action="store_true",
                       help="do not re-hash the evidence and inputs the parts pin (their "
                       "shards hashed them; each part's own files are still verified): the "
                       "merge then reads the parts, not the study")
    merge.add_argument("--trust-parts", action="store_true",
                       help="read parts that another user owns or may write (by default "
                       "refused: a part decides the merged verdicts)")
    merge.add_argument("--key-file", type=Path, metavar="KEY",
                       help="accept only parts signed under this key (HMAC-SHA256; the "
                       "key 'auditor audit --shard --key-file' signed them with): for parts "
                       "that travel or live where others can write")
    merge.add_argument("--no-plots", action="store_true", help="do not render PNG plots")
    merge.add_argument("--quiet", action="store_true", help="no summary table")
    merge.add_argument("--json", action="store_true", help="print summary.json to stdout")


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` (1 <= I <= N) as a pair; a usage error otherwise."""
    from auditor.pipeline.parts import MAX_SHARDS

    found = _SHARD.match(text.strip())
    if found is None or not 1 <= int(found[1]) <= int(found[2]) <= MAX_SHARDS:
        raise UsageError(f"--shard expects I/N with 1 <= I <= N (e.g. 2/8), got {text!r}")
    return int(found[1]), int(found[2])


def collection_options(options: AuditOptions) -> dict[str, Any]:
    """The options that change what a shard collects (merge refuses parts that differ); paths
    absolute, so a merge run from another directory finds them where the shards did."""
    return {
        "sacct": os.path.abspath(options.sacct) if options.sacct else None,
        "sacct_format": list(options.sacct_format) if options.sacct_format else None,
        "sacct_delimiter": options.sacct_delimiter,
        "protocol_inputs": [[name, os.path.abspath(path)]
                            for name, path in options.protocol_inputs],
        "source_root": os.path.abspath(options.source_root) if options.source_root else None,
        "sources": list(options.sources),
    }


def audit_shard(args: argparse.Namespace, options: AuditOptions) -> int:
    """``auditor audit ROOT --shard I/N --out PART``: collect one shard into a part."""
    from auditor.pipeline.audit import Auditor, assemble_collected, drive, paused_gc
    from auditor.pipeline.parts import part_files, read_key
    from auditor.report.output import StagedOutput

    shard = parse_shard(args.shard)
    key = read_key(args.key_file) if args.key_file else None  # (refused before any work)
    if args.out is None:
        raise UsageError("--shard needs --out PART (the part 'auditor merge' reads)")
    if args.json:
        raise UsageError("--shard writes a part, not a summary: --json is for the merge")
    from auditor._cli import _progress, spill_beside
    from auditor.report.output import check_output_dir

    # (before any work, and before the spill folder beside --out is made: --out inside the
    # root is refused as an audit's is, never found after the shard was read)
    if not args.root.is_dir():
        raise UsageError(f"{args.root}: evidence root does not exist or is not a directory")
    check_output_dir(args.out, args.root, args.force)
    with paused_gc(), spill_beside(args.out), _progress(quiet=args.quiet) as show:
        parts = drive(Auditor(args.root, options).collect(shard), show)
        with StagedOutput(args.out, parts.root, args.force, private=True) as staged:
            for name, data in part_files(parts, collection_options(options), key).items():
                staged.put(name, data)
            staged.seal(assemble_collected(parts))
    if not args.quiet:
        files = sum(len(attempt.files) for unit in parts.units
                    for attempt in unit.evidence.attempts)
        print(f"shard {shard[0]}/{shard[1]}: {len(parts.units):,} of {parts.periods_total:,} "
              f"periods, {files:,} evidence files read; part: {args.out}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from auditor._cli import _helper_pays, anchors_of, check_limits, spill_beside, waivers_of
    from auditor.pipeline.audit import drive, judge, merge_parts, paused_gc
    from auditor.report.output import check_output_dir, write_outputs
    from auditor.report.summary import build_summary, dumps

    waivers, anchors = waivers_of(args), anchors_of(args)
    check_limits(args)
    from auditor.pipeline.parts import Trust, read_key

    trust = Trust(key=read_key(args.key_file) if args.key_file else None,
                  anyone=args.trust_parts)
    for part in args.parts:  # (--force would replace the part being merged, whole)
        if os.path.realpath(part) == os.path.realpath(args.out):
            raise UsageError(f"merge: --out {args.out} is one of the parts merged; write the "
                             "merged audit elsewhere")
    parts = merge_parts([_read_part(path, inputs=not args.trust_inputs, trust=trust)
                         for path in args.parts])
    check_output_dir(args.out, parts.root, args.force)
    options = AuditOptions(anchors=anchors, waivers=waivers,
                           max_findings=args.max_findings,
                           max_findings_per_file=args.max_findings_per_file,
                           max_quote=args.max_quote)
    with paused_gc(), spill_beside(args.out), _unwritable_values():
        result = drive(judge(parts, options), lambda event: None)
        write_outputs(result, args.out, force=args.force, plots=not args.no_plots,
                      helper=_helper_pays(result, options))
        summary = build_summary(result) if args.json else None
    if summary is not None:
        sys.stdout.write(dumps(summary).decode())
    elif not args.quiet:
        print(f"merged {len(args.parts)} parts: {result!r}; report: "
              f"{args.out / 'diagnostic.md'}")
    return 0


@contextlib.contextmanager
def _unwritable_values() -> Iterator[None]:
    """A value of the parts that decodes by its type yet cannot be written (a count past a
    table's column, a digest that is not text: a part the caller owns, trusts or had signed,
    altered after its shard wrote it) is one line, never a crash. The collectors bound what
    they read, so a genuine part holds none: the line says so rather than blame the parts
    alone."""
    try:
        yield
    except (OverflowError, UnicodeEncodeError) as error:
        raise InputError(f"merge: a value in the parts cannot be written "
                         f"({type(error).__name__}: {str(error)[:200]}): a part altered after "
                         "its shard wrote it? Audit the shards again; if it persists, it is "
                         "the auditor's defect: please report it") from error


def _read_part(path: Path, inputs: bool, trust: Trust) -> tuple[dict[str, Any], CollectedParts]:
    """A part's ``part.json`` and its collected study, read once and checked (owner, pins,
    ``part.json``, signature: :func:`~auditor.pipeline.parts.read_part`), then its manifest
    verified (every output and, unless not ``inputs``, every input it pins unchanged); one
    line (:class:`InputError`) otherwise."""
    from auditor.pipeline.parts import OWN_FILES, read_part
    from auditor.report.output import verify_outputs

    meta, parts, manifest = read_part(path, trust)
    differences, _ = verify_outputs(path, inputs=inputs, manifest=manifest,
                                    checked=OWN_FILES)
    if differences:
        first = differences[0]
        raise InputError(f"merge: {path}: {len(differences)} difference(s) against its output "
                         f"manifest (first: {first.what} {first.group}/{first.path}); a part "
                         "must verify before it is merged")
    return meta, parts


HANDLERS = {"merge": _merge}
