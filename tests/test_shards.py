"""Sharded audits (issue 21 item 2): ``auditor audit ROOT --shard I/N --out PART`` and
``auditor merge PART... --out DIR`` write, byte for byte, what one audit of the study writes;
merge refuses parts that are not every shard of one study, once each."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from auditor._cli import main
from tests.helpers import (
    MODEL,
    SEED_COMMIT,
    ElementSpec,
    PeriodSpec,
    StudySpec,
    copy_example,
    default_protocol,
    outcome_study,
    write_study,
)

OUTPUTS = ("diagnostic.md", "evidence.md", "summary.json", "periods.parquet",
           "attempts.parquet", "findings.parquet", "evidence.parquet", "phases.parquet",
           "devices.parquet")


def _shards(root: Path, parts: Path, count: int, *extra: str) -> list[Path]:
    paths = []
    for shard in range(1, count + 1):
        part = parts / f"part-{shard}"
        assert main(["audit", str(root), "--shard", f"{shard}/{count}", "--out", str(part),
                     "--quiet", *extra]) == 0
        paths.append(part)
    return paths


def _manifest_without_time(out: Path) -> dict[str, object]:
    manifest = orjson.loads((out / "output_manifest.json").read_bytes())
    manifest.pop("created_utc")
    return manifest


def _damaged(tmp_path: Path) -> Path:
    """A study with what sharding must keep in order: unlisted files in several attempt
    directories, an attempt directory no period names, a file altered after sealing."""
    root = outcome_study(tmp_path / "study", ["completed", "rollout_init_oom", "cancelled",
                                              "terminal_missing", "sigkill_137"])
    for number, attempt in enumerate(sorted(root.glob("*-4gpu/attempt-*"))):
        (attempt / f"stray-{number}.txt").write_text("not listed\n")
    orphan = root / "host-qwen25-7b-gsm8k-c2-s999-4gpu" / "attempt-999"
    orphan.mkdir(parents=True)
    (orphan / "trial-999.json").write_text("{}")
    trace = next(root.glob("*-s163-4gpu/attempt-*/allocator-traces/*.jsonl"))
    trace.write_bytes(trace.read_bytes() + b"\n")
    return root


@pytest.mark.parametrize("count", [2, 3])
def test_a_merge_of_every_shard_is_the_single_audit_byte_for_byte(
        tmp_path: Path, count: int) -> None:
    root = _damaged(tmp_path)
    assert main(["audit", str(root), "--out", str(tmp_path / "single"), "--quiet",
                 "--no-plots"]) == 0
    parts = _shards(root, tmp_path / "parts", count)
    assert main(["merge", *map(str, reversed(parts)), "--out", str(tmp_path / "merged"),
                 "--quiet", "--no-plots"]) == 0
    for name in OUTPUTS:
        assert (tmp_path / "single" / name).read_bytes() == \
            (tmp_path / "merged" / name).read_bytes(), name
    assert _manifest_without_time(tmp_path / "single") == \
        _manifest_without_time(tmp_path / "merged")
    assert main(["verify", str(tmp_path / "merged"), "--quiet"]) == 0


def test_the_example_study_merges_with_its_plots_and_waivers(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    waive = ["--waive", "AUD201:host-qwen25-7b-gsm8k-c2-s161/period-2", "--reason", "known"]
    assert main(["audit", str(root), "--out", str(tmp_path / "single"), "--quiet",
                 *waive]) == 0
    parts = _shards(root, tmp_path / "parts", 2)
    assert main(["merge", *map(str, parts), "--out", str(tmp_path / "merged"), "--quiet",
                 *waive]) == 0
    for name in (*OUTPUTS, "plots/phase_timeline.png", "plots/peak_memory.png"):
        assert (tmp_path / "single" / name).read_bytes() == \
            (tmp_path / "merged" / name).read_bytes(), name


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_merge_refuses_a_missing_or_repeated_shard_and_another_study(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_example(tmp_path)
    parts = _shards(root, tmp_path / "parts", 3)
    out = str(tmp_path / "merged")
    assert "shard 3 of 3 missing" in _refused(capsys, "merge", str(parts[0]), str(parts[1]),
                                               "--out", out)
    assert "given more than once" in _refused(capsys, "merge", *map(str, parts),
                                              str(parts[0]), "--out", out)
    other = outcome_study(tmp_path / "other", ["completed"])
    foreign = _shards(other, tmp_path / "other-parts", 3)
    assert "different studies" in _refused(capsys, "merge", str(parts[0]), str(parts[1]),
                                           str(foreign[2]), "--out", out)
    halves = _shards(root, tmp_path / "halves", 2)
    assert "split the study in 3 and in 2 shards" in _refused(
        capsys, "merge", str(parts[0]), str(halves[1]), "--out", out)
    assert not (tmp_path / "merged").exists()


def test_merge_refuses_a_part_that_does_not_verify(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_example(tmp_path)
    parts = _shards(root, tmp_path / "parts", 2)
    meta = parts[1] / "part.json"
    doc = json.loads(meta.read_text())
    doc["periods"] = []
    meta.write_text(json.dumps(doc))
    err = _refused(capsys, "merge", *map(str, parts), "--out", str(tmp_path / "merged"))
    assert "must verify before it is merged" in err
    # evidence changed after a shard read it is caught too
    shutil.rmtree(parts[1])
    parts = _shards(root, tmp_path / "again", 2)
    log = next(root.glob("*-4gpu/attempt-*/training-*.log"))
    log.write_bytes(log.read_bytes() + b"x")
    assert "difference" in _refused(capsys, "merge", *map(str, parts), "--out",
                                    str(tmp_path / "merged"))



def test_trust_inputs_skips_the_evidence_rehash_but_not_the_parts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``merge --trust-inputs`` reads the parts, not the study: evidence changed after the
    shards read it is not looked at (the merge is the shards' reading), yet a part changed
    after it was written is still refused."""
    root = copy_example(tmp_path)
    parts = _shards(root, tmp_path / "parts", 2)
    single = tmp_path / "single"
    assert main(["audit", str(root), "--out", str(single), "--quiet"]) in (0, 1)
    log = next(root.glob("*-4gpu/attempt-*/training-*.log"))
    log.write_bytes(log.read_bytes() + b"x")
    merged = tmp_path / "merged"
    assert "difference" in _refused(capsys, "merge", *map(str, parts), "--out", str(merged))
    assert main(["merge", *map(str, parts), "--out", str(merged), "--trust-inputs",
                 "--quiet"]) in (0, 1)
    for name in ("diagnostic.md", "summary.json", "periods.parquet"):
        assert (merged / name).read_bytes() == (single / name).read_bytes(), name
    meta = parts[0] / "part.json"
    meta.write_bytes(meta.read_bytes() + b" ")
    assert "must verify before it is merged" in _refused(
        capsys, "merge", *map(str, parts), "--out", str(tmp_path / "again"), "--trust-inputs")

def test_a_part_is_data_not_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A part's data is JSON decoded by the model's types: a pickle in its place (that would
    call a function) is refused, after its manifest is re-pinned as a forger would."""
    import os
    import pickle

    root = copy_example(tmp_path)
    parts = _shards(root, tmp_path / "parts", 2)
    (parts[0] / "part.jsonl").write_bytes(pickle.dumps(os.getcwd))
    _repin(parts[0], "part.jsonl")
    err = _refused(capsys, "merge", *map(str, parts), "--out", str(tmp_path / "merged"))
    assert "part.jsonl line 1: not JSON" in err


def test_merge_refuses_shards_that_listed_the_study_apart_or_a_unit_out_of_its_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Shards start apart: a record moved between them makes the second shard's N-th period
    another record than the first's listing says. Merged, some periods would count twice
    and others not at all, under the same period count; the merge refuses. So it does a
    part (re-pinned, as a forger would) whose units swapped their places."""
    root = copy_example(tmp_path)
    first = _shards(root, tmp_path / "early", 2)[0]
    (root / "pairs/zzz-moved").mkdir()
    (root / "pairs/host-qwen25-7b-code_heavy_tail-c2-s161/period-2.json").rename(
        root / "pairs/zzz-moved/period-2.json")
    second = _shards(root, tmp_path / "late", 2)[1]
    err = _refused(capsys, "merge", str(first), str(second), "--out", str(tmp_path / "m"))
    assert "saw the study differently" in err
    assert not (tmp_path / "m").exists()

    parts = _shards(root, tmp_path / "parts", 2)
    lines = (parts[0] / "part.jsonl").read_bytes().splitlines(keepends=True)
    units = [n for n, line in enumerate(lines) if line.startswith(b'{"unit"')]
    one, two = (json.loads(lines[n]) for n in units[:2])
    one["unit"]["index"], two["unit"]["index"] = two["unit"]["index"], one["unit"]["index"]
    lines[units[0]], lines[units[1]] = (json.dumps(two).encode() + b"\n",
                                        json.dumps(one).encode() + b"\n")
    (parts[0] / "part.jsonl").write_bytes(b"".join(lines))
    _repin(parts[0], "part.jsonl")
    err = _refused(capsys, "merge", *map(str, parts), "--out", str(tmp_path / "m2"))
    assert "not the study's record at that place" in err


@pytest.mark.parametrize("change", ["record", "file"])
def test_merge_refuses_shards_that_saw_a_record_or_a_file_change_between_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str) -> None:
    """Each shard reads every period record and walks every attempt directory (which shard
    hashes a directory's unlisted files follows from them). A record rewritten between the
    shards (a requeued attempt sealed in between: its files listed now), or a file come into
    an attempt directory, under the same listing of records: the merge was accepted, its
    audit not the study's (the requeued attempt's files reported unlisted, one twice in
    evidence.parquet; a new file never said). Refused now, naming both shards."""
    root = copy_example(tmp_path)
    record = sorted((root / "pairs").glob("*/period-*.json"))[1]  # (shard 2's)
    sealed = record.read_bytes()
    if change == "record":
        document = json.loads(sealed)
        document["evidence"] = document["evidence"][:-1]  # (before the seal listed it)
        record.write_text(json.dumps(document, indent=2))
    first = _shards(root, tmp_path / "early", 2)[0]
    if change == "record":
        record.write_bytes(sealed)
    else:
        attempt = sorted(root.glob("*-4gpu/attempt-*"))[0]
        (attempt / "core.12345").write_bytes(b"core")
    second = _shards(root, tmp_path / "late", 2)[1]
    err = _refused(capsys, "merge", str(first), str(second), "--out", str(tmp_path / "m"))
    assert "saw the study differently" in err and "shards 1 and 2" in err
    assert not (tmp_path / "m").exists()
    again = _shards(root, tmp_path / "again", 2)  # (audited again: merged)
    assert main(["merge", *map(str, again), "--out", str(tmp_path / "m"), "--quiet"]) in (0, 1)


def _unit_forged(part: Path, forge: Callable[[dict], None]) -> None:
    """Rewrite the first unit of ``part`` by ``forge`` and re-pin it, as a forger would."""
    lines = (part / "part.jsonl").read_bytes().splitlines(keepends=True)
    at = next(n for n, line in enumerate(lines) if line.startswith(b'{"unit"'))
    document = json.loads(lines[at])
    forge(document["unit"]["evidence"])
    lines[at] = json.dumps(document).encode() + b"\n"
    (part / "part.jsonl").write_bytes(b"".join(lines))
    _repin(part, "part.jsonl")


@pytest.mark.parametrize(("forge", "said"), [
    (lambda unit: unit["attempts"][0]["read"]["traces"][0]["phases"][0].__setitem__(
        "pid", {"__int__": "9" * 30}), "is past a signed 64-bit integer"),
    (lambda unit: unit["attempts"][0]["spec"].__setitem__("index", 2**63 - 1),
     "a value in the parts cannot be written"),
    (lambda unit: unit["record"]["findings"].append(
        {"rule_id": "AUD201", "symbol": "x", "severity": "info", "subject": "s",
         "message": "m", "citations": [], "values": [["k", {"__dict__": [[[1, 2], 3]]}]]}),
     "a mapping's key is not a JSON scalar"),
])
def test_a_part_value_no_shard_writes_is_refused_never_a_crash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], forge: Callable[[dict], None],
        said: str) -> None:
    root = copy_example(tmp_path)
    parts = _shards(root, tmp_path / "parts", 2, "--no-plots")
    _unit_forged(parts[0], forge)
    err = _refused(capsys, "merge", *map(str, parts), "--out", str(tmp_path / "m"),
                   "--trust-inputs", "--no-plots")
    assert said in err and not (tmp_path / "m").exists()


def test_shards_given_a_relative_sacct_merge_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative --sacct is where the shards were run from: their parts name it absolute,
    so the merge, run elsewhere, finds the same file (it refused it as outside the study)."""
    import contextlib

    root = copy_example(tmp_path)
    dump = tmp_path / "given" / "dump.psv"
    dump.parent.mkdir()
    shutil.move(root / "accounting" / "sacct-raw.psv", dump)
    with contextlib.chdir(dump.parent):
        parts = _shards(root, tmp_path / "parts", 2, "--sacct", "dump.psv", "--no-plots")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with contextlib.chdir(elsewhere):
        assert main(["merge", *map(str, parts), "--out", str(tmp_path / "m"), "--quiet",
                     "--no-plots"]) == 0
    assert main(["verify", str(tmp_path / "m"), "--quiet"]) == 0
    # a part is never the merge's output, even forced (it was replaced, whole)
    with contextlib.chdir(parts[0].parent):
        assert main(["merge", *map(str, parts), "--out", parts[0].name, "--force",
                     "--quiet", "--no-plots"]) == 2
    assert (parts[0] / "part.jsonl").is_file()


@pytest.mark.parametrize("line", [
    '{"kind": "terminal", "step": %d, "pid": %d, "rank": 0, "role": "%s", "seq": %d}',
    '{"pid": %d}'])
def test_a_trace_value_past_64_bits_is_read_as_the_shards_merge_it(
        tmp_path: Path, line: str) -> None:
    """A trace line holding an integer past 64 bits (JSON's, read as it is): the whole audit
    and a merge of its shards agree, the value held as no part could (the merge refused the
    parts: a step or pid kept unbounded where the codec holds 64 bits)."""
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    trace = sorted(root.glob("*-s161-4gpu/attempt-*/allocator-traces/*.jsonl"))[0]
    first = json.loads(trace.read_text().splitlines()[0])
    big = 2**64 - 1
    added = (line % (big, first["pid"], first["role"], big) if "terminal" in line
             else line % big) + "\n"
    trace.write_bytes(trace.read_bytes() + added.encode())
    assert main(["audit", str(root), "--out", str(tmp_path / "whole"), "--quiet",
                 "--no-plots"]) == 0
    parts = _shards(root, tmp_path / "parts", 2, "--no-plots")
    assert main(["merge", *map(str, parts), "--out", str(tmp_path / "merged"), "--quiet",
                 "--no-plots"]) == 0
    for name in ("summary.json", "diagnostic.md", "findings.parquet"):
        assert (tmp_path / "whole" / name).read_bytes() == \
            (tmp_path / "merged" / name).read_bytes(), name


def test_shard_usage_errors_are_one_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_example(tmp_path)
    for spec in ("0/2", "3/2", "a/b", "1"):
        assert "--shard expects I/N" in _refused(capsys, "audit", str(root), "--shard", spec,
                                                 "--out", str(tmp_path / "p"))
    assert "needs --out" in _refused(capsys, "audit", str(root), "--shard", "1/2")
    # what judges the merged audit is the merge's: a shard given it would drop it unseen
    for extra in (["--anchor", f"protocol={'0' * 64}"], ["--max-findings", "5"],
                  ["--waive", "AUD201:x/period-1", "--reason", "r"]):
        err = _refused(capsys, "audit", str(root), "--shard", "1/2", "--out",
                       str(tmp_path / "p"), *extra)
        assert extra[0] in err and "give them to 'auditor merge'" in err


def _repin(part: Path, name: str) -> None:
    """Re-pin ``name`` in the part's manifest, as a forger would (so it verifies)."""
    import hashlib

    data = (part / name).read_bytes()
    manifest = json.loads((part / "output_manifest.json").read_text())
    for entry in manifest["outputs"]:
        if entry["path"] == name:
            entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)
    (part / "output_manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("shard", [None, "ab", [1], [1, "three"], [3, 2], [1, 10**12]])
def test_a_part_json_of_the_wrong_shape_is_refused_even_when_pinned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], shard: object) -> None:
    root = copy_example(tmp_path)
    parts = _shards(root, tmp_path / "parts", 2)
    meta = json.loads((parts[1] / "part.json").read_text())
    meta["shard"] = shard
    (parts[1] / "part.json").write_text(json.dumps(meta))
    _repin(parts[1], "part.json")
    err = _refused(capsys, "merge", *map(str, parts), "--out", str(tmp_path / "merged"))
    assert "has no shard I/N" in err


def _pooled_is_merged(root: Path, tmp_path: Path) -> dict[str, object]:
    """Audit ``root`` with two workers and merge its two shards (judged in the merging
    process): the same bytes. The pooled audit's summary."""
    assert main(["audit", str(root), "--out", str(tmp_path / "pooled"), "--quiet",
                 "--no-plots", "--jobs", "2"]) == 0
    parts = _shards(root, tmp_path / "parts", 2)
    assert main(["merge", *map(str, parts), "--out", str(tmp_path / "merged"), "--quiet",
                 "--no-plots"]) == 0
    for name in OUTPUTS:
        assert (tmp_path / "pooled" / name).read_bytes() == \
            (tmp_path / "merged" / name).read_bytes(), name
    summary: dict[str, object] = orjson.loads(
        (tmp_path / "pooled" / "summary.json").read_bytes())
    return summary


def test_periods_judged_in_the_workers_are_those_the_merge_judges(tmp_path: Path) -> None:
    """With ``--jobs 2`` the example study is read, validated and judged in two worker
    processes, a batch of periods a task (its pairs' arms share their array elements, so
    each batch holds both arms of a pair: one attempt a batch asked for, two taken); a
    merge of its shards judges every period in the merging process. The same bytes."""
    _pooled_is_merged(copy_example(tmp_path), tmp_path)


def _one_job_two_periods(root: Path) -> Path:
    """Two periods run one after the other by one element, which hit its time limit:
    the first shut down cleanly (143, flag on, terminal event), the second was the
    limit's. The limit is the second's alone: the attempt its job launched last."""
    periods = [PeriodSpec(pair=f"host-{MODEL}-gsm8k-c2-s{seed}", workload="gsm8k",
                          seed=seed, model=MODEL, period=1, gpus=4, outcome=outcome)
               for seed, outcome in ((161, "coordinated_shutdown"), (162, "timed_out"))]
    spec = StudySpec(study="test_study", array_job_id="7000000", elements=[
        ElementSpec(array_task_id=0, job_id="7000001", periods=periods, node="gpu-node-10")],
        protocol=default_protocol(periods),
        execution_commits={p.pair: SEED_COMMIT for p in periods})
    write_study(spec, root)
    return root


def test_a_batch_holds_every_period_of_a_job(tmp_path: Path) -> None:
    """Asked for one attempt a task (two workers, two attempts), the audit still sends
    the two periods of one job as one batch: judged apart, the first would take the
    job's TIMEOUT for its own end. The single audit, the merge of its shards (judged in
    the merging process) and the verdicts agree."""
    summary = _pooled_is_merged(_one_job_two_periods(tmp_path / "study"), tmp_path)
    periods = summary["periods"]
    assert isinstance(periods, list)
    reasons = sorted((row["seed"], row["reason"]) for row in periods)
    assert [reason for _, reason in reasons] == ["completed", "time_limit"], reasons
