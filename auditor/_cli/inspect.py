"""The commands that inspect what is already there: ``verify`` and ``gate`` (an audit's
outputs), ``sacct`` and ``validate`` (single files), ``rules`` (the rule table)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from itertools import islice
from pathlib import Path

from auditor.errors import InputError, UsageError
from auditor.model.kinds import TRAINING_LOG


def _verify(args: argparse.Namespace) -> int:
    from auditor._cli import _inert
    from auditor.report.output import verify_outputs

    differences, checked = verify_outputs(args.out)
    for diff in differences:
        detail = f" ({diff.detail})" if diff.detail else ""
        where = f"evidence root {diff.path}" if diff.group == "evidence_root" \
            else f"{diff.group}/{diff.path}"
        print(_inert(f"{diff.what}: {where}{detail}"))
    if differences:
        print(f"verify: {len(differences)} difference(s) in {checked} files checked",
              file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"verify: all {checked} listed outputs and inputs match")
        from auditor._cli import _manifest_sha256

        print(f"output_manifest.json SHA-256: {_manifest_sha256(args.out)}")
    return 0


def _gate(args: argparse.Namespace) -> int:
    import hashlib

    import orjson

    from auditor._cli import _inert
    from auditor._io import regular_bytes
    from auditor.report.output import MANIFEST, manifest_outputs

    path = args.out / "summary.json"
    try:
        data = regular_bytes(path, follow=False)  # (a FIFO or link: refused, never waited on)
    except FileNotFoundError:
        raise UsageError(f"{path}: not found; is {args.out} an audit output?") from None
    except OSError as error:
        raise UsageError(f"{path}: unreadable summary ({error.strerror})") from None
    # the verdict is the audit's only as its manifest pins it (an edited summary is not)
    listed = (manifest_outputs(args.out) or {}).get("summary.json")
    if listed != (hashlib.sha256(data).hexdigest(), len(data)):
        raise UsageError(f"{path}: does not match {args.out / MANIFEST} (changed since the "
                         f"audit, or no audit's); run 'auditor verify {args.out}'")
    key = "gate_allow_partial" if args.allow_partial else "gate"
    try:
        summary = orjson.loads(data)
        gate = summary[key] if isinstance(summary, dict) else None
    except (orjson.JSONDecodeError, KeyError) as error:
        raise UsageError(f"{path}: unreadable summary ({error})") from None
    lists = ("included_configurations", "included_by_waiver", "reasons", "waived")
    # (every value read before a word is printed: the verdict is a JSON true, never a
    # truthy "false", and a list of texts is one)
    if not isinstance(gate, dict) or type(gate.get("passed")) is not bool or not all(
            isinstance(items := gate.get(name, []), list)
            and all(isinstance(item, str) for item in items) for name in lists):
        raise UsageError(f"{path}: unreadable summary ({key} is not a gate: 'passed' true or "
                         "false and lists of texts)")
    passed = gate["passed"]
    mode = " (--allow-partial)" if args.allow_partial else ""
    print(f"gate{mode}: {'PASS' if passed else 'FAIL'}")
    included = gate.get("included_configurations", [])
    print(_inert("included configurations: " + (", ".join(included) if included else "none")))
    by_waiver = gate.get("included_by_waiver", [])
    if by_waiver:
        print(_inert("  unresolved, included by waiver: " + ", ".join(by_waiver)))
    for reason in gate.get("reasons", []):
        print(_inert(f"  reason: {reason}"))
    for waived in gate.get("waived", []):
        print(_inert(f"  waived: {waived}"))
    return 0 if passed else 1


def _sacct(args: argparse.Namespace) -> int:
    from auditor._io import HashingReader
    from auditor.collect.inputs import field_findings
    from auditor.collect.sacct import parse_sacct, summary_json, summary_parts

    fields = tuple(f.strip() for f in args.sacct_format.split(",")) if args.sacct_format else None
    _regular_file(args.file)
    try:
        with open(args.file, "rb") as handle:
            dump = parse_sacct(HashingReader(handle), str(args.file), fields, args.delimiter)
    except IsADirectoryError:
        raise InputError(f"{args.file}: is a directory") from None
    except OSError as error:
        raise InputError(f"{args.file}: cannot read ({error.strerror})") from None
    refused = next((f for f in dump.findings if f.rule_id == "AUD009"), None)
    if refused is not None and not dump.jobs:  # (as the audit refuses it: no records)
        raise InputError(refused.message)
    # (what its fields leave unknown, as the audit finds it: said below, and in --json)
    dump = replace(dump, findings=(*dump.findings, *field_findings(dump, str(args.file))))
    if args.json:  # (its entries are written as they are made, below)
        summary, entries = summary_parts(dump)
    else:  # (the table shows its first rows only: entries for those, totals over all)
        from auditor.report.terminal import MAX_SACCT_ROWS

        summary = summary_json(dump, MAX_SACCT_ROWS)
    from auditor._cli import _inert
    from auditor.rules import RULES

    said: Counter[str] = Counter()
    for item in dump.findings:  # (what a reader of the numbers must know, one line each)
        if item.rule_id in SACCT_NOTICES:
            said[item.rule_id] += 1
            if said[item.rule_id] <= NOTES_PER_RULE:
                print(f"auditor: note: {_inert(item.message)}", file=sys.stderr)
    for rule_id, count in sorted(said.items()):
        if count > NOTES_PER_RULE:
            print(f"auditor: note: and {count - NOTES_PER_RULE:,} more {rule_id} "
                  f"({RULES[rule_id].title}); --json lists them", file=sys.stderr)
    for item in dump.findings:  # (the reader's cap: how many it did not keep at all)
        if item.rule_id == "AUD013":
            print(f"auditor: note: {_inert(item.message)}", file=sys.stderr)
    if args.json:
        for chunk in _document_chunks(summary, entries):
            sys.stdout.write(chunk.decode())
        return 0
    from rich.console import Console

    from auditor.report.terminal import sacct_view

    console = Console()
    console.print(sacct_view(dump, summary, console.width))
    return 0


_NO_JOBS = b'{\n  "jobs": [],\n'
"""How :func:`~auditor.report.summary.dumps` opens the ``--json`` document without entries."""


def _document_chunks(document: dict[str, object], entries: Iterator[dict[str, object]],
                     batch: int = 1024) -> Iterator[bytes]:
    """:func:`~auditor.report.summary.dumps` of ``document`` with ``entries`` in its (empty,
    first) ``jobs`` list, byte for byte, ``batch`` entries at a time: a cluster's entries,
    made into one document, peaked at about 8 times the dump's bytes. (An entry orjson
    cannot write, a lone surrogate or an integer past 64 bits, is made printable alone:
    the whole document's fallback leaves every other entry as orjson writes it.)"""
    from auditor.report.summary import dumps

    head = dumps(document)
    chunk = list(islice(entries, batch))
    if not chunk or not head.startswith(_NO_JOBS):  # (the second: never, jobs come first)
        yield dumps({**document, "jobs": [*chunk, *entries]}) if chunk else head
        return
    yield b'{\n  "jobs": [\n'
    first = True
    while chunk:
        yield (b"" if first else b",\n") + _nested(chunk)
        first = False
        chunk = list(islice(entries, batch))
    yield b"\n  ],\n" + head[len(_NO_JOBS):]


def _nested(entries: list[dict[str, object]]) -> bytes:
    """``entries`` as :func:`~auditor.report.summary.dumps` lays them out in the document's
    ``jobs`` list, joined by ``,\\n``: each line two levels (four spaces) in. One orjson call
    a batch (one an entry cost about 10% more CPU); one it cannot write goes through ``dumps``."""
    import orjson

    from auditor.report.summary import dumps

    try:  # (a list's entries are one level in: one more, every newline of the layout's)
        listed = orjson.dumps(entries, option=orjson.OPT_INDENT_2)[2:-2]
        return b"  " + listed.replace(b"\n", b"\n  ")
    except orjson.JSONEncodeError:
        return b",\n".join(b"    " + dumps(entry)[:-1].replace(b"\n", b"\n    ")
                            for entry in entries)


SACCT_NOTICES = frozenset({"AUD008", "AUD019", "AUD021", "AUD023", "AUD024", "AUD026",
                           "AUD124"})
"""Findings ``auditor sacct`` also says on stderr: a row it could not read (and how many
more were not kept), a field the figures need, a dump without JobID or State (every row is
then UNKNOWN: the audit fails its gate), a header that disagrees with --format (which was
used), a dump captured without -D, a dump saved as UTF-16 (read decoded), a state Slurm
does not name."""
NOTES_PER_RULE = 5
"""Notes said of one rule; the rest are counted in one line (a dump of garbage has
thousands of unreadable rows)."""


def _regular_file(path: Path) -> None:
    """Refuse (exit 2) a path that is not a regular file: a device such as /dev/zero would
    be read for ever, a FIFO would wait for a writer."""
    import stat


    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror})") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a directory")
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: is not a regular file (a device, FIFO or socket)")


def _exists(path: Path) -> bool:
    """Whether ``path`` names something (a link, followed, to something): False only when
    it certainly does not (a directory that cannot be searched is no proof)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except OSError:
        pass
    return True


_SCHEMALESS = {
    "training-log": (TRAINING_LOG.loose_compiled, "a training log is plain text, with no "
                     "schema to check it against ('auditor audit' reads it)"),
    "sacct": (re.compile(r".*\.psv"), "a sacct dump is no JSON, with no schema to check it "
              "against ('auditor sacct FILE' reads one)"),
}
"""Kinds of evidence ``validate`` has no schema for: their files' names, and what reads
them."""


_AUDITED_JSON = frozenset({"period", "trial", "device", "process", "idle-check"})
"""The JSON kinds of a study the audit reads to the collectors' default limit (16 MiB)."""
_KIND_WORDS = {"period": "period record", "trial": "trial record", "device": "device evidence",
               "process": "process record", "idle-check": "idle check"}
"""How the audit's AUD012 names each kind."""


def _validate(args: argparse.Namespace) -> int:
    from auditor._cli import _inert
    from auditor._io import HashingReader
    from auditor.collect.allocator_trace import read_allocator_trace
    from auditor.collect.jsondoc import DEFAULT_LIMIT, load_json
    from auditor.collect.protocol import PROTOCOL_LIMIT
    from auditor.schema import KINDS, canonical_kind, kind_for_filename, validate_document

    if args.kind is not None and canonical_kind(args.kind) not in KINDS:
        schemaless = _SCHEMALESS.get(canonical_kind(args.kind))
        raise UsageError(f"--kind must be one of {', '.join(sorted(KINDS))} (or a period "
                         "record's device_evidence, allocator_trace)"
                         + (f": {schemaless[1]}" if schemaless else ""))
    problems = 0
    for path in args.files:
        kind = args.kind or kind_for_filename(str(path.absolute()))
        no_schema = next((why for pattern, why in _SCHEMALESS.values()
                          if pattern.fullmatch(path.name)), None)
        if not _exists(path):  # (said first: no --kind would make it readable)
            unknown = " (nor can its kind be told from the name; pass --kind)" \
                if kind is None and no_schema is None else ""
            raise InputError(f"{path}: no such file{unknown}")
        if kind is None:
            raise UsageError(f"{path}: "
                             f"{no_schema or 'cannot tell its kind from the name; pass --kind'}")
        kind = canonical_kind(kind)
        _regular_file(path)
        try:
            with open(path, "rb") as handle:
                reader = HashingReader(handle)
                if kind == "allocator-record":
                    found = list(read_allocator_trace(reader, str(path)).findings)
                else:  # (the audit's own limit for the kind: what it refuses, this does)
                    limit = PROTOCOL_LIMIT if kind == "protocol" else \
                        DEFAULT_LIMIT if kind in _AUDITED_JSON else 64 << 20
                    doc, found = load_json(reader, str(path), limit,
                                           kind=_KIND_WORDS.get(kind, kind))
                    if doc is not None:
                        found = list(found) + validate_document(kind, doc, str(path))
        except IsADirectoryError:
            raise InputError(f"{path}: is a directory") from None
        except OSError as error:
            raise InputError(f"{path}: cannot read ({error.strerror})") from None
        for item in found:
            print(_inert(f"{item.rule_id} {item.message}"))
        problems += len(found)
        if not found:
            print(_inert(f"{path}: ok ({kind})"))
    return 1 if problems else 0


def _rules(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from auditor.rules import RULES

    table = Table(title="auditor rules", show_lines=False)
    for column in ("id", "symbol", "severity", "title", "triggered by"):
        table.add_column(column)
    for rule in sorted(RULES.values(), key=lambda rule: rule.rule_id):
        table.add_row(rule.rule_id, rule.symbol, rule.severity.value, rule.title,
                      rule.description)
    Console(width=max(120, int(os.environ.get("COLUMNS", "0") or 0))).print(table)
    return 0
