"""The diagnostic report: golden file for the example study, untrusted text kept inert."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor._cli import main
from auditor.report.mdformat import code_block, code_span, md_escape, prose
from tests.helpers import EXAMPLE, audit, copy_example, find, outcome_study, rewrite

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "example_diagnostic.md"
HOSTILE = ("torch.OutOfMemoryError: <img src=x> [click](http://evil.example) "
           "![x](http://evil.example/p.png) ``` # Heading \x1b[31mred\x1b[0m | col | <!-- -->")


def _without_output_hashes(text: str) -> str:
    """Output hashes depend on library versions (Parquet writer, PNG encoder) and, for
    ``evidence.md``, on where the checkout is (it names the evidence root), as does the
    locator's ``BASE``: mask them."""
    text = re.sub(r"^(\S+\.(?:parquet|png|json|md))  [0-9a-f]{64}  \d+$",
                  r"\1  <sha256>  <size>", text, flags=re.MULTILINE)
    return re.sub(r"^BASE=.*$", "BASE=<evidence root>", text, flags=re.MULTILINE)


def test_example_report_matches_golden_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    text = _without_output_hashes((out / "diagnostic.md").read_text())
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "report changed: rerun with UPDATE_GOLDEN=1 and review"


def test_each_quote_stands_beside_the_pointer_or_line_it_was_read_at(tmp_path: Path) -> None:
    """Two pointers of one file holding the same value keep a quote each (once folded into
    "(1; eligible_failure)", TOTAL_TRAINING_STEPS read as the status), and a trace's lines
    each carry their own record."""
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    text = (out / "evidence.md").read_text()  # (every period's own citations)
    assert ("`trial-5055846.json#/invocation/exit_code` (`1`), "
            "`#/dispatch/TOTAL_TRAINING_STEPS` (`1`), `#/status` (`eligible_failure`)" in text)
    assert ("`allocator-traces/allocator-758712.jsonl:7` (`actor_update step 1`), "
            "`:8` (`weight_sync step 1`)" in text)


def test_a_job_outside_the_array_is_not_called_one_of_its_elements(tmp_path: Path) -> None:
    """Element 8 rerun as a job of its own (no array id): the headline counts eight array
    elements and names the job outside it, and the allocation scope says what it sums
    (it read 'all nine array elements' and 'summed over elements')."""
    root = copy_example(tmp_path)
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"5055845_8|", b"5055845|").replace(b"5055845_8.", b"5055845."),
            update_manifest=False)
    audit(root, tmp_path / "out")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert ("All eight array elements of `5055845` ended `FAILED 2:0`, with no scheduler "
            "`OUT_OF_MEMORY` state. Outside the array, the job `5055845` `FAILED` also ran "
            "attempts. The last job, actual job `5055845`, ended at **19:27:18 UTC**.") in text
    # the allocation scope is per array element (the contract's): the job outside the array
    # is counted apart, named
    assert ("summed over elements): **18,468 GPU-seconds = 5.130000000 GPU-hours**. The one job "
            "outside the array that ran attempts (`5055845`, a retry submitted on its own) is "
            "not part of that scope: **2,360 GPU-seconds**, counted apart") in text



def test_period_records_without_an_array_id_leave_the_elements_in_their_array(
        tmp_path: Path) -> None:
    """The array is then the one sacct's JobIDs name: no element is said to be 'outside'."""
    from tests.helpers import edit_record, period_records

    root = copy_example(tmp_path)
    for record in period_records(root):
        edit_record(record, lambda r: r.pop("array_job_id"))
    audit(root, tmp_path / "out")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "All nine array elements of `5055845` ended `FAILED 2:0`" in text
    assert "Outside the array" not in text and "outside it" not in text


def test_untrusted_log_text_cannot_inject_markup(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["rollout_init_oom"])
    log = find(root, "*/attempt-*/training-*.log")
    rewrite(root, log, lambda b: b.replace(b"ray.exceptions.RayTaskError(OutOfMemoryError): ",
                                           HOSTILE.encode(), 1))
    audit(root, tmp_path / "out")
    from markdown_it import MarkdownIt

    report = (tmp_path / "out" / "diagnostic.md").read_text()
    cited = (tmp_path / "out" / "evidence.md").read_text()
    assert "evil.example" in cited  # the hostile line is quoted, inert (in a code span)
    for text in (report, cited):
        assert "\x1b" not in text
        rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
        outside = re.sub(r"<code>.*?</code>", "", rendered, flags=re.DOTALL)
        assert "<img" not in outside and "<!--" not in outside and "evil" not in outside
        assert "<h1>Heading" not in rendered
        for line in text.splitlines():
            assert not line.startswith("# Heading")


@pytest.mark.parametrize("hostile", [HOSTILE, "`" * 5 + "x", "a\nb\r\nc", "<b>bold</b>",
                                     "[a](javascript:alert(1))", "-" * 3, "1. list"])
def test_escaping_helpers(hostile: str) -> None:
    escaped = md_escape(hostile)
    assert "\n" not in escaped and "<" not in escaped
    assert "](" not in escaped.replace("\\]\\(", "")
    span = code_span(hostile)
    fence = re.match(r"`+", span)
    assert fence is not None
    inner = span[len(fence.group()):-len(fence.group())]
    assert fence.group() not in inner
    block = code_block([hostile, "```", "~~~~"])
    opening = block.splitlines()[0].removesuffix("text")
    assert all(line.strip() != opening for line in block.splitlines()[1:-1])


_ESCAPE_ALPHABET = "a1. -=_*:<&\n\x00\u0661"


def test_plain_text_shortcut_escapes_as_the_full_path_does() -> None:
    # A leading NUL is removed by the full path, so it forces that path on the same text.
    # Exhaustive over short texts (a sample misses "1." or "-x"), at the clipping edges too.
    for size in range(5):
        for chars in itertools.product(_ESCAPE_ALPHABET, repeat=size):
            text = "".join(chars)
            for limit in (1, 2, 3, 300):
                assert md_escape(text, limit) == md_escape("\x00" + text, limit), (text, limit)


@given(st.text(alphabet="az09 ,.:;/@%=-_*`#|<&\n\x00\u202e", max_size=60))
def test_plain_text_shortcut_on_longer_texts(text: str) -> None:
    assert md_escape(text) == md_escape("\x00" + text)


def test_long_quotes_are_clipped() -> None:
    assert len(md_escape("x" * 10_000)) <= 300
    assert len(code_span("y" * 10_000)) <= 210


def test_every_table_column_holds_what_its_name_says(tmp_path: Path) -> None:
    """Rows are tuples in schema order: each column is checked against what it names, read
    from the evidence itself (manifests, file bytes, trace lines, trial records) or from
    summary.json, so two columns swapped, even of one type, fail."""
    import hashlib

    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    from auditor.rules import RULES
    from tests.helpers import copy_example, period_records

    root = copy_example(tmp_path)
    altered = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/allocator-traces/*.jsonl")
    rewrite(root, altered, lambda b: b + b"\n", update_manifest=False)
    out = tmp_path / "out"
    summary = audit(root, out)

    def table(name: str) -> list[dict]:
        """The table's rows as Python values (timestamps as their nanoseconds)."""
        read = pq.read_table(out / f"{name}.parquet")
        read = pa.table([column.cast(pa.int64()) if pa.types.is_timestamp(column.type)
                         else column for column in read.columns], names=read.column_names)
        rows: list[dict] = read.to_pylist()
        return rows

    listed = {}
    for record_path in period_records(root):
        record = orjson.loads(record_path.read_bytes())
        for index, attempt in enumerate(record.get("attempts") or [record]):
            for entry in attempt["evidence"]:
                listed[f"{attempt['attempt_dir']}/{entry['path']}"] = (
                    record, index, attempt, entry, record_path.relative_to(root).as_posix())
    evidence = table("evidence")
    assert {row["path"] for row in evidence} == set(listed)
    for row in evidence:
        record, index, attempt, entry, manifest = listed[row["path"]]
        data = (root / row["path"]).read_bytes()
        assert (row["kind"], row["pair"], row["period"], row["attempt"], row["job_id"],
                row["manifest"]) == (entry["kind"], record["pair"], record["period"], index + 1,
                                     attempt["job_id"], manifest)
        assert (row["expected_size"], row["expected_sha256"]) == (entry["size"],
                                                                  entry["sha256"])
        assert (row["size"], row["actual_sha256"]) == (len(data),
                                                       hashlib.sha256(data).hexdigest())
        assert (row["status"], row["detail"]) == (
            ("mismatched", f"size {entry['size']} != {len(data)}, sha256")
            if row["path"] == altered else ("verified", ""))

    phases = table("phases")
    assert len(phases) > 200
    for row in phases:
        line = (root / row["path"]).read_bytes().splitlines()[row["line"] - 1]
        raw = orjson.loads(line)
        record, index = listed[row["path"]][:2]
        assert (row["subject"], row["attempt"]) == (
            f"{record['pair']}/period-{record['period']}", index + 1)
        for column, key in (("pid", "pid"), ("rank", "rank"), ("role", "role"), ("seq", "seq"),
                            ("phase", "phase"), ("step", "step"), ("started", "started_ns"),
                            ("finished", "finished_ns"),
                            ("peak_allocated_bytes", "peak_allocated_bytes"),
                            ("peak_reserved_bytes", "peak_reserved_bytes")):
            assert row[column] == raw.get(key), (column, row, raw)
        assert (row["error_type"] or None) == (raw.get("error_type") or None)

    periods = {(p["pair"], p["period"]): p for p in summary["periods"]}
    report = (out / "diagnostic.md").read_text()
    records = {(r["pair"], r["period"]): r for r in
               (orjson.loads(path.read_bytes()) for path in period_records(root))}
    for row in table("periods"):
        expected = periods[(row["pair"], row["period"])]
        record = records[(row["pair"], row["period"])]
        assert row["subject"] == f"{row['pair']}/period-{row['period']}"
        assert row["array_task_id"] == record["array_task_id"]
        workers = sorted(record["workers"], key=lambda worker: worker["rank"])
        assert row["pids_by_rank"] == [worker["pid"] for worker in workers]
        trial = orjson.loads((root / find(root, f"{record['attempt_dir']}/trial-*.json"))
                             .read_bytes())
        assert row["raw_peak_mib"] == trial["peak_mib"]
        log = (root / find(root, f"{record['attempt_dir']}/training-*.log")).read_bytes()
        assert row["log_lines"] == len(log.splitlines())
        assert row["last_step"] is None  # (no step lines in the example's logs)
        for column in ("workload", "seed", "gpus", "job_id", "verdict", "reason"):
            assert row[column] == expected[column], column
        assert list(row["rule_ids"]) == expected["rule_ids"]
        assert f"**Limits.** {prose(row['limits'], limit=4000)}" in report
        assert row["diagnosis"] != row["limits"]
        finished = (row["actor_update_finished"], row["post_update_sync_finished"])
        assert None in finished or finished[0] < finished[1]

    attempts = table("attempts")
    assert sorted(row["subject"] for row in attempts if row["counted"]) == sorted(
        f"{pair}/period-{period}" for pair, period in periods)  # one counted per period
    assert sum(row["wasted"] for row in attempts) == summary["accounting"]["wasted_attempts"]
    for row in attempts:
        trial_path = find(root, f"{row['attempt_dir']}/trial-*.json")
        trial = orjson.loads((root / trial_path).read_bytes())
        invocation = trial["invocation"]
        assert (row["received_signal"], row["launcher_status"]) == (
            invocation["received_signal"], trial["status"])
        assert row["exit_kind"] in ("clean", "failure")
        assert row["attempt"] == trial["attempt"]  # (from 1, as the launcher counts)
        assert row["attempt_dir"].endswith(f"attempt-{row['job_id']}")
        pair, period = row["subject"].rsplit("/period-", 1)
        judged = periods[(pair, int(period))]
        if judged["attempts"] == 1:  # (its one attempt is judged as the period)
            assert (row["outcome"], row["reason"]) == (judged["verdict"], judged["reason"])
        assert (row["started"], row["finished"], row["exit_code"]) == (
            invocation["started_ns"], invocation["finished_ns"], invocation["exit_code"])
        assert row["gpus"] <= row["allocation_gpus"]
        assert 0 < row["task_gpu_seconds"] <= row["reservation_gpu_seconds"]
        assert row["reservation_gpu_seconds"] == pytest.approx(
            (row["finished"] - row["started"]) / 1e9 * row["allocation_gpus"])

    findings = table("findings")
    subjects = {f"{pair}/period-{period}" for pair, period in periods} | set(listed)
    assert {row["rule_id"] for row in findings} >= {"AUD102", "AUD201"}
    for row in findings:
        rule = RULES[row["rule_id"]]
        assert (row["symbol"], row["severity"]) == (rule.symbol, rule.severity.value)
        first = row["citations"][0]
        where = f"{row['path']}:{row['line']}" if row["line"] is not None \
            else f"{row['path']}#{row['pointer']}" if row["pointer"] else row["path"]
        assert first == where
        assert row["subject"] in subjects
        assert " " in row["message"] and row["message"] != row["subject"]


def test_tables_stream_in_row_groups_and_read_back_whole(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A table is written a row group at a time (bounded memory on millions of rows):
    with small groups it spans several, and still reads back row for row, as the manifest
    hashed it."""
    import pyarrow.parquet as pq

    from auditor.pipeline.audit import run_audit
    from auditor.report import tables
    from auditor.store.rows import phase_rows
    from tests.helpers import copy_example

    root = copy_example(tmp_path)
    result = run_audit(root)
    assert len(result.collected.timeline) == len(result.collected.periods)  # (all whole)
    expected = [dict(zip(tables.SCHEMAS["phases"].names, row, strict=True))
                for period in result.collected.timeline for attempt in period.attempts
                for row in phase_rows(period, attempt)]
    monkeypatch.setattr("auditor.store.tables.BATCH_ROWS", 7)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 49)
    out = tmp_path / "out"
    audit(root, out)
    parquet = pq.ParquetFile(out / "phases.parquet")
    assert len(expected) > 200
    groups = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    full, rest = divmod(len(expected), 49)
    assert groups == [49] * full + ([rest] if rest else [])
    read = parquet.read()
    assert read.schema.metadata[b"auditor.partial"] == b"false"
    assert read.num_rows == len(expected)
    assert read.column("line").to_pylist() == [row["line"] for row in expected]
    assert main(["verify", str(out)]) == 0


def test_output_directory_is_as_readable_as_the_umask_allows(tmp_path: Path) -> None:
    """The outputs are staged in a private temporary directory; the finished directory
    gets the usual mode, so colleagues on a shared cluster can read the report."""
    for mask, mode in ((0o022, 0o755), (0o077, 0o700), (0o002, 0o775)):
        old = os.umask(mask)
        try:
            out = tmp_path / f"out-{mask:o}"
            audit(EXAMPLE, out)
        finally:
            os.umask(old)
        assert out.stat().st_mode & 0o777 == mode
        assert (out / "diagnostic.md").stat().st_mode & 0o777 == mode & 0o666


def test_hostile_names_in_records_stay_inert_when_the_report_is_rendered(
        tmp_path: Path) -> None:
    """A workload name carrying a backtick, raw HTML and a javascript link (copied into the
    headline's configuration list) stays text in code, even rendered with raw HTML on."""
    from markdown_it import MarkdownIt

    root = copy_example(tmp_path)
    hostile = "x` <img src=x onerror=alert(9)> [a](javascript:alert(9)) `y\x1b[31m"
    for record in sorted((root / "pairs").glob("host-qwen25-7b-gsm8k-c2-s16*/period-*.json")):
        document = orjson.loads(record.read_bytes())
        document["workload"] = hostile
        record.write_bytes(orjson.dumps(document))
    audit(root, tmp_path / "out")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "\x1b" not in text
    rendered = MarkdownIt("commonmark", {"html": True}).render(text)
    assert "<img" not in rendered.replace("&lt;img", "")
    assert 'href="javascript:' not in rendered


def test_a_launcher_status_holding_backticks_is_one_code_span() -> None:
    """A launcher's status is shown whole in one code span, fenced past its backticks (it
    was cut into spans and words at each one); two spans of one backtick stay two."""
    from markdown_it import MarkdownIt

    from auditor.model.lines import launcher_status
    from auditor.report.mdformat import prose

    said = prose(launcher_status("infra|`structure`_invalid", None))
    assert said == "The launcher recorded status ``infra|`structure`_invalid``."
    rendered = MarkdownIt("commonmark").render(said)
    assert "<code>infra|`structure`_invalid</code>" in rendered
    assert prose(launcher_status("`edge`", None)).endswith("`` `edge` ``.")
    assert prose("`a` and `b`") == "`a` and `b`"


def test_periods_sharing_a_job_and_number_are_named_by_subject() -> None:
    """A group's "Applies to" names each period by its pair and number with its job
    (contract v1.2), unless two periods of the study share a job and number (found sorted
    on disk): then by its subject alone, no job said that would name two."""
    from dataclasses import replace

    from auditor.pipeline.audit import run_audit
    from auditor.report.markdown import render_markdown
    from tests.helpers import EXAMPLE

    result = run_audit(EXAMPLE)
    plain = render_markdown(result)
    applies = re.compile(r"^Applies to: `[^`]+/period-\d+` \(job \d+\)", re.MULTILINE)
    assert applies.search(plain)
    facts = list(result.reasoning.facts)
    facts[1] = replace(facts[1], job_id=facts[0].job_id, period=facts[0].period)
    clashing = replace(result, reasoning=replace(result.reasoning, facts=tuple(facts)))
    named = render_markdown(clashing)
    assert not applies.search(named) and "Applies to: `" in named


def test_a_large_uniform_arrays_elapsed_times_are_not_all_spelled_out(tmp_path: Path) -> None:
    """The accounting sentence of a uniform array names a dozen elapsed times and sends the
    reader to evidence.md for the rest: it grew by one number an element (330: 1,727
    characters on one line)."""
    from auditor.report.appendix import ELAPSED_SHOWN

    root = tmp_path / "scale"
    assert main(["example", "--kind", "scale", "--elements", "20", "--trace-samples", "2",
                 "--log-lines", "2", str(root)]) == 0
    audit(root, tmp_path / "out")
    (line,) = [line for line in (tmp_path / "out" / "diagnostic.md").read_text().splitlines()
               if line.startswith("Elements ")]
    assert line.split("`ElapsedRaw` ", 1)[1].count(", ") == ELAPSED_SHOWN - 1
    assert line.endswith(f" s and {20 - ELAPSED_SHOWN} more ([`evidence.md`](evidence.md)).")


def test_an_unlisted_files_row_names_no_pair(tmp_path: Path) -> None:
    """A file no record lists belongs to no period: its evidence row's pair is null (it was
    the top folder, an attempt's parent, which matches no pair of periods.parquet)."""
    import pandas as pd

    root = copy_example(tmp_path)
    attempt = next(root.glob("*-4gpu/attempt-*"))
    (attempt / "stray.txt").write_text("not listed\n")
    audit(root, tmp_path / "out")
    evidence = pd.read_parquet(tmp_path / "out" / "evidence.parquet")
    stray = evidence[evidence["status"] == "unlisted"]
    assert len(stray) == 1 and stray["pair"].isna().all()
    pairs = set(pd.read_parquet(tmp_path / "out" / "periods.parquet")["pair"])
    assert set(evidence["pair"].dropna()) <= pairs


def test_a_files_finding_a_verdict_rests_on_is_its_periods_not_the_studys(
        tmp_path: Path) -> None:
    """A listed device file gone: its finding (about the file) is what its period's verdict
    rests on, said there, never again among the findings about no single period; a file no
    record lists in that period's attempt is among those about a period's files, naming the
    period."""
    root = copy_example(tmp_path)
    attempt = next(root.glob("*code_heavy_tail-c2-s163-2gpu/attempt-*"))
    next(attempt.glob("device-evidence/*-0-*.json")).unlink()
    (attempt / "stray.txt").write_text("not listed\n")
    audit(root, tmp_path / "out")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    files = text.split("Errors and warnings about a period's files:", 1)[1].split("\n\n", 2)[1]
    assert "`AUD101`" not in files and "`AUD105`" in files
    assert "(`host-qwen25-7b-code_heavy_tail-c2-s163/period-1`)" in files
    assert "Errors and warnings about no single period:" not in text
    assert re.search(r"^- `host-qwen25-7b-code_heavy_tail-c2-s163/period-1` .*"
                     r"`evidence_missing`.*device-evidence/", text, re.MULTILINE)


def test_without_a_dump_the_attempts_table_gives_no_reservation(tmp_path: Path) -> None:
    """No scheduler dump: the reservation scope is unknown, in summary.json and in each
    attempt's row alike (the table gave the period's GPUs as the allocation's, and a sum the
    summary calls unknown)."""
    import pandas as pd

    root = copy_example(tmp_path)
    (root / "accounting" / "sacct-raw.psv").unlink()
    summary = audit(root, tmp_path / "out")
    assert summary["accounting"]["reservation_gpu_seconds"] is None
    attempts = pd.read_parquet(tmp_path / "out" / "attempts.parquet")
    assert attempts["reservation_gpu_seconds"].isna().all()
    assert attempts["allocation_gpus"].isna().all()
    assert attempts["task_gpu_seconds"].notna().all()
    audit(copy_example(tmp_path / "again"), tmp_path / "dumped")  # (with it: known)
    assert pd.read_parquet(tmp_path / "dumped" / "attempts.parquet")[
        "reservation_gpu_seconds"].notna().all()


def test_an_unreadable_record_is_a_period_of_no_known_configuration_never_a_seed_not_run(
        tmp_path: Path) -> None:
    """A period record cut short: its period still counts (unresolved), the Configurations
    section names it as of no known configuration, the seed it may be is 'no period read'
    (never 'not run'), and its group does not say the dump lacks its job's row (sacct has it;
    the record names no job)."""
    root = copy_example(tmp_path)
    record = root / "pairs/host-qwen25-7b-math-c2-s161/period-2.json"
    record.write_bytes(b'{"schema": "run-evidence/period/v1", "pair": ')
    audit(root, tmp_path / "out")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    section = text.split("## Configurations", 1)[1].split("\n## ", 1)[0]
    assert "| `math@2` | 162-163 (no period read: 161) |" in section and "not run" not in section
    assert ("1 period of no known configuration (a record unreadable, or naming no workload "
            "or GPUs), unresolved: `host-qwen25-7b-math-c2-s161/period-2`.") in section
    assert "has no row for these periods' jobs" not in text
    assert "No job of these periods is known" in text


@pytest.mark.parametrize("status", ["ok", "`", "a`", "x`y`z`", "a``b`c"])
def test_a_diagnosis_splits_into_its_sentences_whatever_the_status_quotes(status: str) -> None:
    """A launcher status with an odd number of backticks is one span fenced past them: the
    sentences after it are still sentences (each backtick flipped 'inside a span', gluing the
    rest of the diagnosis into one), and a full stop inside a span never splits."""
    from auditor.model.lines import launcher_status
    from auditor.report.groups import sentences

    text = f"{launcher_status(status, None)} The post-period idle check passed. Exit: 0."
    assert len(sentences(text)) == 3
    assert sentences("See `a. B` here. Then more.") == ("See `a. B` here.", "Then more.")


def test_a_configurations_own_reasons_stand_when_the_gate_fails(tmp_path: Path) -> None:
    """Review S: where even ``--allow-partial`` fails (nothing resolves), every row's "why"
    was "the gate fails", though each configuration had unresolved periods of its own."""
    from tests.helpers import outcome_study

    root = outcome_study(tmp_path / "study", ["terminal_missing", "terminal_missing"])
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    rows = [line for line in (out / "diagnostic.md").read_text().splitlines()
            if line.startswith("| `gsm8k@4` |")]
    assert rows and rows[0].endswith("| no: two unresolved |"), rows


def test_a_root_whose_name_holds_a_newline_writes_no_line_of_its_own(tmp_path: Path) -> None:
    """Review Q: the evidence locator's ``BASE=`` line wrote a root's name as it is: a
    newline in it made a line of the report (a heading a line-based reader sees)."""
    root = tmp_path / "st\n## Included configurations: all"
    assert main(["example", str(root)]) == 0
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    for name in ("diagnostic.md", "evidence.md"):
        lines = (out / name).read_text().splitlines()
        assert not [line for line in lines if line.startswith("## Included")], name


def test_a_deciding_line_quotes_only_the_place_it_cites(tmp_path: Path) -> None:
    """Review S: an altered log's unresolved line cited the whole file and quoted its
    terminal line (borrowed from another citation of the same file), as if that line
    decided the mismatch."""
    from tests.helpers import find, outcome_study, rewrite

    root = outcome_study(tmp_path / "study", ["completed"])
    log = find(root, "*-s161-4gpu/attempt-*/training-*.log")
    rewrite(root, log, lambda data: data + b"appended later\n", update_manifest=False)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    (line,) = [text for text in (out / "diagnostic.md").read_text().splitlines()
               if text.startswith("- `host-") and "evidence_mismatch" in text]
    assert "global_step" not in line and "step:" not in line, line


def test_a_finding_about_a_file_of_a_periods_attempt_is_among_its_rules(
        tmp_path: Path) -> None:
    """Review S: a log that ends mid-line (``AUD017``, about the file) was listed among the
    findings about no single period and missing from its period's ``rule_ids``, where the
    integrity findings about its files were there."""
    from tests.helpers import find, outcome_study, rewrite

    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    log = find(root, "*-s162-4gpu/attempt-*/training-*.log")
    rewrite(root, log, lambda data: data + b"step:2 - cut mid-li")
    summary = audit(root, tmp_path / "out")
    rules = {p["seed"]: p["rule_ids"] for p in summary["periods"]}
    assert "AUD017" in rules[162] and "AUD017" not in rules[161]
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "Errors and warnings about no single period:" not in text
    # (its line beside its file, never after the period's name: "(...): 18: the log ...")
    lines = (root / log).read_bytes().count(b"\n") + 1
    assert f"`AUD017` `{log}:{lines}` (`host-qwen25-7b-gsm8k-c2-s162/period-1`): the log " \
           "ends mid-line" in text


def test_the_reports_integrity_line_says_summarys_count(tmp_path: Path) -> None:
    """Review S: the report said "all 144 listed evidence files verified" where summary.json
    (and the terminal) said 162 listed: the period records are counted there too. The
    report says the sum first, then its parts."""
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    integrity = orjson.loads((out / "summary.json").read_bytes())["integrity"]
    text = (out / "diagnostic.md").read_text()
    assert f"Integrity: {integrity['files_listed']:,} files listed: " in text


def test_a_whole_file_then_a_line_of_it_is_cited_as_the_line() -> None:
    """Review S: a file cited whole (no quote) and then at a line without a quote was
    written ``training-<job>.log,1``, a place no reader can open."""
    from auditor.report.citations import _locations  # (a group's pattern renders by it)

    # (the whole file and its line, their quotes not shared by every period of the group)
    said = _locations("training-<job>.log", [("", ""), (":1", ""), (":5", "")])
    assert said == "`training-<job>.log:1,5`", said


def test_the_commits_line_says_when_the_study_has_no_pins(tmp_path: Path) -> None:
    """Review S: without ``execution_commits.json`` the provenance said "Commit(s) recorded
    by the period records: `...`; is not confirmed by `execution_commits.json`." (no
    subject, nor that the file is absent)."""
    root = copy_example(tmp_path)
    (root / "execution_commits.json").unlink()
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    (line,) = [text for text in (out / "diagnostic.md").read_text().splitlines()
               if text.startswith("Commit(s) recorded by the period records")]
    assert line.endswith("no `execution_commits.json` confirms it (the study has none)."), line


def _waived_line(root: Path, out: Path, rule: str) -> str:
    """The unresolved line of the second period (s162), audited with ``rule`` waived for it."""
    subject = "host-qwen25-7b-gsm8k-c2-s162/period-1"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots",
                 "--waive", f"{rule}:{subject}", "--reason", "reviewed"]) == 0
    (line,) = [text for text in (out / "diagnostic.md").read_text().splitlines()
               if text.startswith(f"- `{subject}`")]
    return line


def test_a_waived_periods_line_says_it_was_waived(tmp_path: Path) -> None:
    """Review S: a period whose gate reason a waiver lifted still read "Needs a rerun or a
    waiver" in the unresolved list."""
    from tests.helpers import outcome_study

    root = outcome_study(tmp_path / "study", ["completed", "terminal_missing"])
    line = _waived_line(root, tmp_path / "out", "AUD201")
    assert "Needs" not in line and line.endswith("Waived for the gate (`AUD201`: see Waivers).")


def test_an_altered_file_keeps_its_period_out_whatever_is_waived(tmp_path: Path) -> None:
    """Review U: a log without its terminal line altered after sealing: its deciding line
    quoted the terminal check's "no terminal event" (a whole-file citation of the same file),
    and, its AUD102 waived, it read "Waived for the gate" while the altered file kept its
    configuration out. The line says what is wrong with the file, and that it still needs a
    fix."""
    from tests.helpers import find, outcome_study, rewrite

    root = outcome_study(tmp_path / "study", ["completed", "terminal_missing"])
    log = find(root, "*-s162-4gpu/attempt-*/training-*.log")
    rewrite(root, log, lambda data: data + b"appended later\n", update_manifest=False)
    line = _waived_line(root, tmp_path / "out", "AUD102")
    assert "no terminal event" not in line and "differs from" in line, line
    assert line.endswith("Needs an evidence fix (`AUD102` waived: see Waivers)."), line
