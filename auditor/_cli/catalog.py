"""``auditor catalog``, ``auditor query`` and ``auditor rerun``: across studies, and what to rerun.

``catalog OUT... --into CAT [--name NAME]`` adds finished audits (verified first) to a
catalogue of hive-partitioned Parquet tables; ``query CAT "SQL" [--json|--csv] [--limit N]``
runs DuckDB over it and prints the result (a table of at most 1,000 rows by default, then a
line saying how many it did not show); ``rerun DIR [--json]`` prints one line
per reason group of an audit's unresolved periods with the ``--array=`` spec of its
elements. The work is :mod:`auditor.catalog`'s; this module only parses and prints.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path
from typing import Any


def add_parsers(commands: Any) -> None:
    """Add ``catalog``, ``query`` and ``rerun`` to ``commands`` (argparse sub-parsers)."""
    catalog = commands.add_parser(
        "catalog", help="add finished audits to a catalogue across studies",
        description="Verify each audit output, then add its tables to CAT as "
        "CAT/<table>/study=<name>/part-0.parquet (the same audit again replaces it).")
    catalog.add_argument("outs", type=Path, nargs="+", metavar="OUT",
                         help="an audit's output directory (--out)")
    catalog.add_argument("--into", type=Path, required=True, metavar="CAT",
                         help="the catalogue directory (made when missing)")
    catalog.add_argument("--name", help="the study's name in the catalogue (default: "
                         "summary.json's study); tells apart two studies sharing a name")
    catalog.add_argument("--replace", action="store_true",
                         help="replace a study the catalogue holds under the same name from "
                         "other inputs (an audit of the study after more evidence came); "
                         "without it, that is refused")

    query = commands.add_parser(
        "query", help="run SQL (DuckDB) over a catalogue",
        description="Tables: periods, attempts, findings, evidence, phases, devices, "
        "studies (each with study and schema_version). Built-in views: verdicts, "
        "gpu_seconds, suspect_hardware (binomial test, p < 0.01 Bonferroni). Only reading "
        "statements run (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, PIVOT, "
        "EXPLAIN): the catalogue is never written. A column name given twice is made "
        "unique as DuckDB makes a subquery's (a, a_1, a_2...), in every format.")
    query.add_argument("catalog", type=Path, metavar="CAT")
    query.add_argument("sql", metavar="SQL")
    form = query.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    form.add_argument("--csv", action="store_true", help="print the rows as CSV")
    query.add_argument("--limit", type=_rows, default=None, metavar="N",
                       help=f"print at most N rows, 0 for all (default: the table "
                       f"{TABLE_LIMIT:,}, then a line saying how many were not shown; "
                       "--json and --csv every row); N above 2**63-1 is refused")

    rerun = commands.add_parser(
        "rerun", help="print what to rerun of an audit, as --array= specs",
        description="One line per reason group of the audit's unresolved periods "
        "(never a resolved or failed one): the group and its elements' --array= spec.")
    rerun.add_argument("out", type=Path, metavar="DIR", help="an audit's output directory")
    rerun.add_argument("--json", action="store_true", help="print the plan as JSON")


TABLE_LIMIT = 1000
"""Rows the table shows by default (a rich table of 100,000 rows takes minutes to draw)."""
MAX_ROWS = (1 << 63) - 1
"""The largest ``--limit`` (DuckDB takes a row count as a signed 64-bit integer at most)."""


def _rows(text: str) -> int:
    """``--limit``'s value: a whole number of rows from 0 (all) to :data:`MAX_ROWS`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of rows") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a number of rows (0: all)")
    if value > MAX_ROWS:
        raise argparse.ArgumentTypeError(f"{value} rows is more than the most a query can "
                                         f"give ({MAX_ROWS}, 2**63-1; 0: all)")
    return value


def _catalog(args: argparse.Namespace) -> int:
    from auditor._cli import _inert
    from auditor._signals import signals_deferred

    with signals_deferred():  # (a compiled extension is not to be cut short loading)
        import pyarrow.parquet  # noqa: F401

        from auditor.catalog.store import add_audits
    for added in add_audits(list(args.outs), args.into, args.name, args.replace):
        what = "replaced" if added.replaced else "added"
        rows = ", ".join(f"{table} {count:,}" for table, count in added.rows.items())
        print(_inert(f"{what} {added.name} from {added.source} ({rows})"))
    return 0


def _query(args: argparse.Namespace) -> int:
    from auditor._signals import signals_deferred

    with signals_deferred():  # (a compiled extension is not to be cut short loading)
        from auditor.catalog.query import load_duckdb, run_query

        load_duckdb()
    machine = args.json or args.csv
    limit = (None if machine else TABLE_LIMIT) if args.limit is None else args.limit or None
    result = run_query(args.catalog, args.sql, limit)
    columns, rows = result.columns, result.rows
    if args.json:
        import orjson

        from auditor.report.summary import json_safe_numbers

        records = [dict(zip(columns, row, strict=True)) for row in rows]
        sys.stdout.write(orjson.dumps(json_safe_numbers(records), default=str,
                                      option=orjson.OPT_INDENT_2
                                      | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    elif args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(["" if value is None else value for value in row] for row in rows)
    else:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        from auditor._cli import _inert

        table = Table(show_lines=False)
        for column in columns:
            table.add_column(Text(_inert(column)), overflow="fold")
        for row in rows:  # (as text, never markup nor emoji codes; control bytes escaped)
            table.add_row(*(Text("" if value is None else _inert(str(value))) for value in row))
        Console(width=max(120, int(os.environ.get("COLUMNS", "0") or 0)), markup=False,
                emoji=False, highlight=False).print(table)
        if result.total > len(rows):
            print(f"{len(rows):,} of {result.total:,} row(s) shown, "
                  f"{result.total - len(rows):,} not shown (--limit 0 shows them all; "
                  "--csv and --json print every row)")
        else:
            print(f"{len(rows):,} row(s)")
    if machine and result.total > len(rows):  # (stdout holds the rows only)
        print(f"query: {len(rows):,} of {result.total:,} row(s) printed (--limit "
              f"{args.limit})", file=sys.stderr)
    return 0


def _rerun(args: argparse.Namespace) -> int:
    from auditor._cli import _inert
    from auditor._signals import signals_deferred

    with signals_deferred():  # (a compiled extension is not to be cut short loading)
        import pyarrow.parquet  # noqa: F401

        from auditor.catalog.rerun import rerun_plan
    plan = rerun_plan(args.out)
    if args.json:
        import orjson

        document = [{"group": g.group, "cause": g.cause, "meaning": g.meaning,
                     "reasons": list(g.reasons), "array": g.array,
                     "array_job_id": g.array_job_id, "task_ids": list(g.task_ids),
                     "subjects": list(g.subjects), "without_task_id": list(g.without_task_id)}
                    for g in plan]
        sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    if not plan:
        print("rerun: nothing to rerun (every period is resolved or failed)")
    for group in plan:
        spec = f"--array={group.array}" if group.array else "(no array task id)"
        if group.array and group.array_job_id:
            spec += f" of array {group.array_job_id}"
        note = f"{len(group.subjects)} period(s): {', '.join(group.reasons)}"
        if group.without_task_id:
            note += "; without an array task id: " + ", ".join(group.without_task_id)
        print(_inert(f"{group.name} {spec}  # {note}"))  # (an id or pair is evidence's text)
    return 0


HANDLERS = {"catalog": _catalog, "query": _query, "rerun": _rerun}
