"""The report states each diagnosis group's evidence once, as its pattern, with only the
periods that differ listed; every period's own citations are in ``evidence.md`` (written,
pinned in the output manifest, linked from the report). Also: what the report says beside
the gate, retried periods, cancelled periods, and text from evidence kept inert."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from auditor import run_audit
from auditor._cli import main
from tests.helpers import EXAMPLE, copy_example, edit_json, find, outcome_study, rewrite

HOSTILE = ("torch.OutOfMemoryError: <img src=x> [click](http://evil.example) "
           "![x](http://evil.example/p.png) ``` # Heading www.evil.example | col | <!-- -->")


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ev") / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    return out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mixed")
    assert main(["example", str(base / "study"), "--kind", "mixed"]) == 0
    assert main(["audit", str(base / "study"), "--out", str(base / "out"), "--quiet",
                 "--no-plots"]) == 0
    return base / "out"


def _bullets(text: str) -> dict[str, str]:
    """``evidence.md``'s bullets: period subject -> its citations."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^- `([^`]+)`: (.*)$", text,
                                                        re.MULTILINE)}


def test_evidence_md_is_written_pinned_and_linked(example: Path) -> None:
    manifest = orjson.loads((example / "output_manifest.json").read_bytes())
    listed = {item["path"] for item in manifest["outputs"]}
    assert "evidence.md" in listed
    assert main(["verify", str(example)]) == 0
    report = (example / "diagnostic.md").read_text()
    assert "[`evidence.md`](evidence.md)" in report
    evidence = (example / "evidence.md").read_text()
    assert "[`diagnostic.md`](diagnostic.md)" in evidence


def test_evidence_md_holds_every_citation_of_every_period(example: Path) -> None:
    result = run_audit(EXAMPLE)
    bullets = _bullets((example / "evidence.md").read_text())
    assert set(bullets) == {v.subject for v in result.verdicts}
    for verdict in result.verdicts:
        text = bullets[verdict.subject]
        for cite in verdict.citations:
            assert cite.path.rsplit("/", 1)[-1] in text, (verdict.subject, cite)
            where = f":{cite.line}" if cite.line is not None else \
                f"#{cite.pointer}" if cite.pointer else ""
            assert where in text, (verdict.subject, cite)


def test_each_group_states_its_evidence_once_as_a_pattern(example: Path) -> None:
    """Nine periods, one line of citations each group, no per-period file names."""
    report = (example / "diagnostic.md").read_text()
    assert report.count("Evidence, the same in every period") == 2
    assert "allocator-758712" not in report and "trial-5055846.json" not in report
    assert "Exceptions" not in report


def test_a_period_whose_citations_differ_is_listed_as_the_exception(tmp_path: Path) -> None:
    """One 4-GPU trace with a sample record more before its update: its period cites lines
    8 and 9, the other eight the pattern's 7 and 8; only it is listed, with its own."""
    root = copy_example(tmp_path)
    trace = find(root, "host-qwen25-7b-math-c2-s162-4gpu/attempt-*/allocator-traces/"
                       "allocator-3539673.jsonl")

    def extra_sample(data: bytes) -> bytes:
        records = [orjson.loads(line) for line in data.splitlines()]
        first = records[0]
        sample = {"pid": first["pid"], "sample_ns": first["finished_ns"] + 1000,
                  "allocated_bytes": 1, "reserved_bytes": 2}
        records.insert(1, sample)
        for seq, record in enumerate(records):  # (seq keeps rising)
            record["seq"] = seq
        return b"".join(orjson.dumps(r) + b"\n" for r in records)

    rewrite(root, trace, extra_sample)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = (out / "diagnostic.md").read_text()
    assert ("Evidence, the same in 8 of 9 periods (the other, "
            "`host-qwen25-7b-math-c2-s162/period-2`: [`evidence.md`](evidence.md))") in report
    assert "allocator-3539673" not in report  # (the exception's own citations: evidence.md)
    cited = (out / "evidence.md").read_text()
    line = next(line for line in cited.splitlines()
                if line.startswith("- `host-qwen25-7b-math-c2-s162/period-2`"))
    assert "`allocator-traces/allocator-3539673.jsonl:8` (`actor_update step 1`), `:9`" in line


def test_the_headline_never_says_more_than_the_gate(tmp_path: Path) -> None:
    """A trace altered after sealing fails even --allow-partial: the report must not say
    evaluation is restricted to the resolved subset (it did)."""
    root = copy_example(tmp_path)
    trace = find(root, "host-qwen25-7b-gsm8k-c2-s161-2gpu/attempt-*/allocator-traces/*.jsonl")
    rewrite(root, trace, lambda b: b + b"\n", update_manifest=False)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert not summary["gate_allow_partial"]["passed"]
    report = (out / "diagnostic.md").read_text()
    assert "Evaluation is restricted" not in report
    assert "**No configuration can enter the evaluation: the gate fails, even with " \
           "`--allow-partial`" in report


def test_a_retried_period_has_a_row_and_pids_per_attempt(mixed: Path) -> None:
    """In ``evidence.md``'s table of every period (the report's holds the unresolved
    periods that reached the final step)."""
    report = (mixed / "evidence.md").read_text()
    assert re.search(r"^\| — \| math / 164 \| 5061011 / 1, attempt 1 \| 4 \| resolved \|",
                     report, re.MULTILINE)
    assert re.search(r"^\| — \| math / 164 \| 5061012 / 1, attempt 2 \| 4 \| completed, "
                     r"wasted; not counted \|", report, re.MULTILINE)
    assert re.search(r"^5061011 / 1, attempt 1: \d+(,\d+){3}$", report, re.MULTILINE)
    assert re.search(r"^5061012 / 1, attempt 2: \d+(,\d+){3}$", report, re.MULTILINE)


def test_a_cancelled_period_says_what_its_traces_show_and_its_sacct_row(mixed: Path) -> None:
    report = (mixed / "diagnostic.md").read_text()
    group = report.split("unresolved period: `cancelled`")[1].split("###")[0]
    assert "Scheduler: `CANCELLED 0:15` for the one element: the `CANCELLED` row at " \
           "`accounting/sacct-raw.psv:" in group
    assert "The traces show the phases reached (every rank): `init_model`, `rollout_init`, " \
           "`weight_sync`, `rollout_generate`." in group


def test_findings_about_no_period_are_still_said(mixed: Path) -> None:
    """The per-finding table is gone; an array's or a configuration's error, which no
    diagnosis group says, is listed."""
    report = (mixed / "diagnostic.md").read_text()
    assert "| Rule | Subject | Message |" not in report
    assert "- `AUD213` `code_heavy_tail@4`: no period covers seed(s) 164" in report
    assert "- `AUD210` `5061000_[12]`: element `5061000_[12]` is still PENDING" in report


def _outside_code(html: str) -> str:
    return re.sub(r"<code>.*?</code>", "", html, flags=re.DOTALL)


def test_hostile_log_text_stays_inert_in_both_reports(tmp_path: Path) -> None:
    """Quoted in code spans (fenced by more backticks than it holds), a hostile log line
    renders as text: no tag, link or heading outside code, in either file."""
    from markdown_it import MarkdownIt

    root = outcome_study(tmp_path / "study", ["rollout_init_oom"])
    log = find(root, "*/attempt-*/training-*.log")
    rewrite(root, log, lambda b: b.replace(b"ray.exceptions.RayTaskError(OutOfMemoryError): ",
                                           HOSTILE.encode(), 1))
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    evidence = (out / "evidence.md").read_text()
    assert "evil.example" in evidence  # (quoted, inert)
    for name in ("diagnostic.md", "evidence.md"):
        text = (out / name).read_text()
        html = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
        rest = _outside_code(html)
        assert "<img" not in rest and "<!--" not in rest and "<h1>Heading" not in rest
        assert "evil.example" not in rest, name  # (not even a bare www. GitHub would link)
        assert "\x1b" not in text


def test_terminal_summary_says_what_the_findings_mean_and_what_was_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(EXAMPLE)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "9 error findings: the 9 unresolved periods' reasons; the gate fails on them" in said
    assert "nothing was written (no --out)" in said
    assert "report:" not in said and "diagnostic.md explains" not in said
    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "nothing was written" not in said
    assert f"report: {tmp_path / 'out' / 'diagnostic.md'}" in said


def test_a_sacct_exit_without_its_128_is_said_to_be_the_attempts(tmp_path: Path) -> None:
    """The attempt exited 143; sacct's ExitCode says 15:0 (the 128 dropped): the group's
    scheduler sentence says it may be the same exit, not a second one."""
    root = outcome_study(tmp_path / "study", ["flag_off_143"])  # (its dump says 15:0)
    assert b"|FAILED|15:0|" in (root / "accounting/sacct-raw.psv").read_bytes()
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert ("Scheduler: `FAILED 15:0` for the one element: `15:0` may be the attempt's 143 "
            "less 128 (sacct drops the 128).") in (out / "diagnostic.md").read_text()


def _shared_gpu(root: Path, seed: int) -> str:
    """Plants ``AUD113`` in period ``...-s<seed>``: its rank 1's device file names rank 0's
    GPU. Returns that uuid."""
    devices = sorted(root.glob(f"*-s{seed}-*gpu/attempt-*/device-evidence/*.json"))
    uuid: str = orjson.loads(devices[0].read_bytes())["gpu"]["uuid"]
    edit_json(root, devices[1].relative_to(root).as_posix(),
              lambda d: d["gpu"].__setitem__("uuid", uuid))
    return uuid


def test_an_identity_mismatch_cites_the_finding_that_decided_it(tmp_path: Path) -> None:
    """A period on more GPUs than sacct's AllocTRES held (``AUD129``) and one whose two ranks
    name one GPU (``AUD113``): evidence.md listed each one's trial, traces and log, but
    neither the dump's row nor the two device files that decided it (findings.parquet had
    them). Each is now cited once; a resolved period beside them is cited as before."""
    clean = outcome_study(tmp_path / "clean", ["completed"] * 3)
    root = outcome_study(tmp_path / "study", ["completed"] * 3)
    rewrite(root, "accounting/sacct-raw.psv", lambda b: b.replace(  # (s161's element)
        b"gres/gpu:a100=4,gres/gpu=4,mem=240G,node=1|gpu-node-10|None",
        b"gres/gpu:a100=2,gres/gpu=2,mem=240G,node=1|gpu-node-10|None", 1),
        update_manifest=False)
    uuid = _shared_gpu(root, 162)
    bullets = {}
    for name, study in (("clean", clean), ("study", root)):
        out = tmp_path / f"out-{name}"
        assert main(["audit", str(study), "--out", str(out), "--quiet", "--no-plots"]) == 0
        bullets[name] = _bullets((out / "evidence.md").read_text())
    short = bullets["study"]["host-qwen25-7b-gsm8k-c2-s161/period-1"]
    assert short.endswith("`pairs/host-qwen25-7b-gsm8k-c2-s161/period-1.json#/idle_check/"
                          "passed` (`true`), `#/gpus` (`4`); `accounting/sacct-raw.psv:1` "
                          "(`2`)"), short
    assert short.count("sacct-raw.psv") == 1 and short.count("#/gpus") == 1
    shared = bullets["study"]["host-qwen25-7b-gsm8k-c2-s162/period-1"]
    for rank, pid in ((0, 2169854), (1, 2169855)):
        cited = f"`device-evidence/worker-actor_rollout-{rank}-{pid}.json#/gpu/uuid` (`{uuid}`)"
        assert shared.count(cited) == 1, shared
        assert shared.count(f"worker-actor_rollout-{rank}-") == 1
    # the near miss: a resolved period, its own citations alone, as in the clean study
    resolved = "host-qwen25-7b-gsm8k-c2-s163/period-1"
    assert bullets["study"][resolved] == bullets["clean"][resolved]
    assert "sacct-raw.psv" not in bullets["study"][resolved]
    assert "device-evidence" not in bullets["study"][resolved]


def test_a_deciding_file_is_never_the_one_cut_from_a_long_line(tmp_path: Path) -> None:
    """An 8-GPU period cites 11 files of its own (trial, 8 traces, log, record): with the two
    device files of an ``AUD113``, 13, past the 12 a line names; the device files stay and
    one of the period's own is counted instead."""
    from tests.helpers import element_study, period_spec

    root = element_study(tmp_path / "study", [("7000001", [period_spec(gpus=8)])])
    uuid = _shared_gpu(root, 161)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    (line,) = _bullets((out / "evidence.md").read_text()).values()
    assert line.count(f"#/gpu/uuid` (`{uuid}`)") == 2, line
    assert line.endswith("; and 1 more files"), line


def test_every_deciding_finding_is_cited_in_evidence_md(mixed: Path) -> None:
    """Whatever the reason (here a sacct ``TIMEOUT``, ``infrastructure_failure``, among
    others): each citation of the findings that decided a period is on its line."""
    result = run_audit(mixed.parent / "study")
    bullets = _bullets((mixed / "evidence.md").read_text())
    timeout = bullets["host-qwen25-7b-code_heavy_tail-c2-s163/period-1"]
    assert timeout.endswith("; `accounting/sacct-raw.psv:33` (`TIMEOUT`)"), timeout
    for verdict in result.verdicts:
        text = bullets[verdict.subject]
        for cite in (c for item in verdict.findings for c in item.citations):
            assert cite.path.rsplit("/", 1)[-1] in text, (verdict.subject, cite)
            where = f":{cite.line}" if cite.line is not None else \
                f"#{cite.pointer}" if cite.pointer else ""
            assert where in text, (verdict.subject, cite)
