"""``sacct --json`` of a real Slurm 24.11 read as the ``-P`` dump of the same array.

``fixtures/slurm/24.11/`` holds the endings array (``tests/slurm/endings.py``) as Slurm 24.11.5
(Debian 13's packages, in a chroot; ``SOURCES.md`` says how) dumped it: each ``-P`` capture
the harness makes, the contract's fields plus ``Restarts`` (``restarts.psv``, ``-D`` too),
and the ``--json`` of the same moments (``json.json``, ``json-D.json``, ``midrun*.json``,
each taken between two identical ``-P`` captures). No cluster is needed here.

The JSON must read as its ``-P`` twin: the same jobs, states, steps, attempts, pending ranges,
GPU-seconds and findings, with one difference, the exit codes, which JSON holds exactly (143
where ``-P`` prints ``15:0``; no ``exit_code_may_be``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from auditor._cli import main
from tests.helpers import sacct_document as sacct
from tests.slurm.cluster import CONTRACT_FORMAT

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "slurm" / "24.11"
RESTARTS_FORMAT = CONTRACT_FORMAT + ",Restarts"

EXACT = {2: 143, 10: 137, 11: 255}
"""The endings whose script exit ``-P`` prints less 128 (``15:0``, ``9:0``, ``127:0``)."""


def exits(node: Any, found: list[tuple[Any, Any, Any]]) -> Any:
    """``node`` with each exit code and its ``exit_code_may_be`` taken out into ``found``
    (in document order): what is left must be equal between the twins."""
    if isinstance(node, list):
        return [exits(item, found) for item in node]
    if not isinstance(node, dict):
        return node
    if "exit_code" in node:
        found.append((node["exit_code"], node.get("exit_code_may_be", "absent"), node["signal"]))
    return {key: exits(value, found) for key, value in node.items()
            if key not in ("exit_code", "exit_code_may_be")}


def same_but_exits(psv: dict[str, Any], json: dict[str, Any], psv_path: Path,
                   json_path: Path) -> list[tuple[Any, Any]]:
    """Assert the two documents equal but for exit codes (and the file each finding names):
    the JSON's have no ``exit_code_may_be``, each is one the ``-P`` code may stand for; the
    (printed, exact) exit code pairs."""
    printed: list[tuple[Any, Any, Any]] = []
    exact: list[tuple[Any, Any, Any]] = []
    left, right = exits(psv, printed), exits(json, exact)
    for finding in right["findings"]:
        finding["message"] = finding["message"].replace(str(json_path), str(psv_path))
    assert left == right
    pairs = []
    for (code, may_be, signal), (real, only, real_signal) in zip(printed, exact, strict=True):
        assert signal == real_signal
        assert only == "absent"                                     # exact: nothing to guess
        assert real in (may_be or [None]), (code, may_be, real)       # what -P said it may be
        pairs.append((code, real))
    return pairs


@pytest.mark.parametrize(("json_name", "psv_name", "extra"), [
    ("json", "restarts", ("--format", RESTARTS_FORMAT)),
    ("json-D", "restarts-D", ("--format", RESTARTS_FORMAT)),
])
def test_json_reads_as_the_p_dump_of_the_same_array(
        capsys: pytest.CaptureFixture[str], json_name: str, psv_name: str,
        extra: tuple[str, ...]) -> None:
    """The final dumps, without and with ``-D``: the JSON and the ``-P`` dump with
    ``Restarts`` read the same, AUD024 included (without ``-D``, tasks 6 and 7 restarted once
    and have one record), exit codes aside; JSON's are the scripts' own."""
    psv_path, json_path = DUMPS / f"{psv_name}.psv", DUMPS / f"{json_name}.json"
    psv, json = sacct(capsys, psv_path, *extra), sacct(capsys, json_path)
    pairs = same_but_exits(psv, json, psv_path, json_path)
    assert {(code, real) for code, real in pairs if code != real} == {
        (15, 143), (9, 137), (127, 255)}
    jobs = {job["array_task_id"]: job for job in json["jobs"]}
    for task, code in EXACT.items():
        assert jobs[task]["exit_code"] == code and "exit_code_may_be" not in jobs[task]
        assert jobs[task]["steps"][0]["exit_code"] == code
    assert [f["rule_id"] for f in json["findings"]] == (
        [] if json_name.endswith("-D") else ["AUD024"])
    if json_name.endswith("-D"):
        assert [len(jobs[task]["attempts"]) for task in (6, 7)] == [1, 1]
        assert json["totals"]["requeued_gpu_seconds"] == psv["totals"]["requeued_gpu_seconds"] > 0


@pytest.mark.parametrize("name", ["midrun", "midrun-2", "midrun-2-D"])
def test_mid_run_json_reads_as_its_twin(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Mid-run: RUNNING elements (End unknown), the pending range the JSON holds as a hex
    bitmap (``0xF000``: ``1_[12-15%12]``), requeued elements pending again."""
    psv_path, json_path = DUMPS / f"{name}.psv", DUMPS / f"{name}.json"
    psv, json = sacct(capsys, psv_path), sacct(capsys, json_path)
    for job in json["jobs"]:
        job.pop("restarts")  # (the -P capture has no Restarts: nor its AUD024)
    json["findings"] = [f for f in json["findings"] if f["rule_id"] != "AUD024"]
    same_but_exits(psv, json, psv_path, json_path)
    if name == "midrun":
        ranges = [job for job in json["jobs"] if job["array_task_id"] is None]
        assert [(job["job_id"], job["state"], job["pending_tasks"]) for job in ranges] == [
            ("1_[12-15%12]", "PENDING", [12, 13, 14, 15])]


def derived(tmp_path: Path, name: str, change: Any) -> Path:
    """``json.json`` (parsed) changed by ``change(document)``, written as ``name``."""
    document = orjson.loads((DUMPS / "json.json").read_bytes())
    change(document)
    path = tmp_path / name
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    return path


def refused(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    capsys.readouterr()
    assert main(["sacct", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(path) in lines[0]
    return lines[0]


def as_older(document: dict[str, Any], release: str, plugin: dict[str, str]) -> None:
    """The document as an older sacct --json shapes it (openapi dbv0.0.38 of 22.05,
    data_parser v0.0.39 of 23.02): ``meta.Slurm`` with int versions, ``state.current`` a
    string, exit codes ``SUCCESS`` 0."""
    major, minor, micro = (int(part) for part in release.split("."))
    document["meta"] = {"plugin": plugin, "Slurm": {
        "version": {"major": major, "micro": micro, "minor": minor}, "release": release}}
    for job in document["jobs"]:
        job["state"]["current"] = job["state"]["current"][0]
        job["exit_code"] = {"status": "SUCCESS", "return_code": 0}


@pytest.mark.parametrize(("release", "plugin"), [
    ("22.05.8", {"type": "openapi/dbv0.0.38", "name": "Slurm OpenAPI DB v0.0.38"}),
    ("23.02.7", {"type": "openapi/dbv0.0.39", "name": "Slurm OpenAPI DB v0.0.39",
                 "data_parser": "v0.0.39"}),
])
def test_json_before_23_11_is_refused_naming_the_version(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, release: str,
        plugin: dict[str, str]) -> None:
    """Slurm 22.05's and 23.02's JSON dumps every normal exit as SUCCESS with return code 0:
    refused in one line naming the release and why, never read as exits of 0."""
    path = derived(tmp_path, f"sacct-{release}.json",
                   lambda document: as_older(document, release, plugin))
    line = refused(capsys, path)
    assert f"Slurm {release}" in line and "SUCCESS with return code 0" in line, line
    assert "-P" in line


def test_json_without_meta_is_refused_by_its_shape(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No ``meta``: a ``state.current`` that is a string is the shape of a Slurm before 23.11."""
    def strip(document: dict[str, Any]) -> None:
        as_older(document, "22.05.8", {"type": "openapi/dbv0.0.38"})
        del document["meta"]
    assert "a Slurm before 23.11" in refused(capsys, derived(tmp_path, "old.json", strip))


UNUSABLE: dict[str, Any] = {
    "truncated": lambda data: data[: len(data) // 2],
    "not-utf8": lambda data: data.replace(b'"endings"', b'"end\xffings"', 1),
    "malformed": lambda data: data.replace(b'"jobs": [', b'"jobs": [,', 1),
    "no-jobs": lambda data: b'{"meta": {}, "errors": [], "warnings": []}',
    "not-an-object": lambda data: b"[" + data + b"]",
    # (review V: refused by a whole parse, and so when read a record at a time; the first
    # crashed, an integer the stdlib will not convert, the others were taken for a list)
    "integer-of-5000-digits": lambda data: data.replace(
        b'"allocation_nodes": 1', b'"allocation_nodes": ' + b"9" * 5000, 1),
    "jobs-true": lambda data: b'{"jobs": true, "meta": {}, "errors": [], "warnings": []}',
    "jobs-then-true": lambda data: data.replace(b'\n  "meta"', b'\n  "jobs": true,\n  "meta"', 1),
}


@pytest.mark.parametrize("form", sorted(UNUSABLE))
def test_unusable_json_is_one_line_never_a_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, form: str) -> None:
    path = tmp_path / f"{form}.json"
    path.write_bytes(UNUSABLE[form]((DUMPS / "json.json").read_bytes()))
    refused(capsys, path)


def test_json_over_the_limit_is_refused(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from auditor.collect.sacct import slurmjson
    monkeypatch.setattr(slurmjson, "MAX_JSON_BYTES", 64 << 10)
    assert "is not read" in refused(capsys, DUMPS / "json.json")


def test_a_record_that_cannot_be_read_is_aud008(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    """One record with a state that is no list of flags: an AUD008 naming its place in
    ``jobs``; the others are read."""
    def spoil(document: dict[str, Any]) -> None:
        document["jobs"][3]["state"]["current"] = 5
    document = sacct(capsys, derived(tmp_path, "spoilt.json", spoil))
    said = [f for f in document["findings"] if f["rule_id"] == "AUD008"]
    assert len(said) == 1 and "jobs[3]: state 5; record not used" in said[0]["message"], said
    assert len(document["jobs"]) == 15


KIT = DUMPS / "kit"


def audited(root: Path, out: Path, *extra: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``auditor audit ROOT --out OUT``: its summary.json and its findings."""
    import pyarrow.parquet as pq

    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots", *extra]) == 0
    findings = pq.read_table(out / "findings.parquet",
                             columns=["rule_id", "subject", "message"]).to_pylist()
    return orjson.loads((out / "summary.json").read_bytes()), findings


def test_the_audit_reads_the_json_twin_as_the_p_dump(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The producer kit's array on the same 24.11 (``kit/``): its sealed study audited with
    its ``-D`` dump (``accounting/sacct-raw.psv``), with the ``--json -D`` twin in its place
    (``accounting/sacct-raw.json``, found when there is no ``.psv``) and given by
    ``--sacct``: the same summary (every verdict, reason, gate, figure) and the same
    findings; only sacct's words differ (``CANCELLED by root``, the JSON naming the user)."""
    import shutil

    psv, psv_findings = audited(KIT / "study", tmp_path / "psv")
    root = tmp_path / "study"
    shutil.copytree(KIT / "study", root)
    (root / "accounting" / "sacct-raw.psv").unlink()
    shutil.copy(KIT / "contract-D.json", root / "accounting" / "sacct-raw.json")
    json, json_findings = audited(root, tmp_path / "json")
    given, _ = audited(KIT / "study", tmp_path / "given", "--sacct", str(KIT / "contract-D.json"))
    capsys.readouterr()
    assert json == psv
    assert given["periods"] == psv["periods"] and given["gate"] == psv["gate"]
    assert {(p["pair"], p["verdict"], p["reason"]) for p in psv["periods"]} >= {
        ("kit-coordinated-off-s4", "unresolved", "killed"),
        ("kit-requeue-s8", "resolved", "completed")}
    assert [(f["rule_id"], f["subject"], f["message"].replace("by root", "by 0"))
            for f in json_findings] == [
        (f["rule_id"], f["subject"], f["message"]) for f in psv_findings]


def test_the_kit_json_has_the_exact_exits(capsys: pytest.CaptureFixture[str]) -> None:
    """Where the kit's -P dump prints 15:0, 10:0, 9:0 and 127:0 (the trainer's 143, the
    forwarded USR1's 138, the SIGKILL's 137, the wrapper's 255), the JSON says so exactly."""
    jobs = {job["array_task_id"]: job for job in sacct(capsys, KIT / "contract-D.json")["jobs"]}
    assert {task: jobs[task]["exit_code"] for task in (4, 7, 9, 10)} == {
        4: 143, 7: 138, 9: 137, 10: 255}



def test_an_unusable_json_dump_is_the_audits_aud009_naming_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A study whose ``accounting/sacct-raw.json`` is cut short: the audit runs, and its
    AUD009 names the file and says why (never a traceback)."""
    import shutil

    root = tmp_path / "study"
    shutil.copytree(KIT / "study", root)
    (root / "accounting" / "sacct-raw.psv").unlink()
    data = (KIT / "contract-D.json").read_bytes()
    (root / "accounting" / "sacct-raw.json").write_bytes(data[: len(data) // 3])
    summary, findings = audited(root, tmp_path / "out")
    capsys.readouterr()
    refused = [f for f in findings if f["rule_id"] == "AUD009"]
    assert len(refused) == 1, refused
    assert "accounting/sacct-raw.json" in refused[0]["message"]
    assert "not readable JSON" in refused[0]["message"]
    assert summary["gate"]["passed"] is False


def test_mutated_json_is_read_or_refused_never_a_crash() -> None:
    """Bytes flipped or cut, and values of the real 24.11 dump swapped for values of other
    types (None, negative numbers, empty containers, a list in a string's place): each dump
    is read (bad records as AUD008) or refused with SacctFormatError, nothing else."""
    import copy
    import io
    import random

    from auditor.collect.sacct import parse_sacct
    from auditor.errors import SacctFormatError

    base = (DUMPS / "json-D.json").read_bytes()
    document = orjson.loads(base)
    values: list[Any] = [None, 0, -1, 1.5, "", "x", [], {}, [1], {"set": True, "number": -5},
                         {"set": True}, True, "0xZZ", ["COMPLETED", 3], [{}], 2**63, -2**63]

    def places(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        found = [prefix] if prefix else []
        items = node.items() if isinstance(node, dict) else enumerate(node) \
            if isinstance(node, list) else ()
        for key, value in items:
            found.extend(places(value, (*prefix, key)))
        return found

    every = places(document)
    rng = random.Random(39)
    for round_ in range(240):
        if round_ % 3 == 0:
            data = bytearray(base)
            for _ in range(rng.randint(1, 5)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            if rng.random() < 0.3:
                data = data[: rng.randrange(len(data))]
            raw = bytes(data)
        else:
            changed = copy.deepcopy(document)
            for _ in range(rng.randint(1, 4)):
                node = changed
                place = rng.choice(every)
                try:  # (an earlier change may have replaced a container on the way)
                    for key in place[:-1]:
                        node = node[key]
                    node[place[-1]] = rng.choice(values)
                except (KeyError, IndexError, TypeError):
                    continue
            raw = orjson.dumps(changed)
        try:
            parse_sacct(io.BytesIO(raw), "mutated.json")
        except SacctFormatError:
            pass


def test_a_large_json_dump_is_read_a_record_at_a_time(tmp_path: Path) -> None:
    """Review T: a ``sacct --json`` dump was parsed whole, its objects ten times its bytes
    (5 GB for one of 500 MB, under the 512 MiB limit). It is read a record of ``jobs`` at a
    time: what parsing it holds at its peak stays within four times its bytes (the text,
    the bytes it was decoded from, the rows), and the rows are those of a whole parse."""
    import io
    import tracemalloc

    from auditor.collect.sacct import parse_sacct

    document = orjson.loads((DUMPS / "json.json").read_bytes())
    document["jobs"] = document["jobs"] * 60
    data = orjson.dumps(document, option=orjson.OPT_INDENT_2)
    tracemalloc.start()
    try:
        dump = parse_sacct(io.BytesIO(data), "big.json", None, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(data), (peak, len(data))
    assert len(dump.jobs) == len(parse_sacct(io.BytesIO(
        (DUMPS / "json.json").read_bytes()), "one.json", None, None).jobs)


def test_read_a_record_at_a_time_it_accepts_and_places_as_a_whole_parse(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Review V: nesting orjson takes (up to 1,024 levels) was refused by the stdlib's
    scanner's lower depth, and a refused number's place was counted from its record's
    start, not the file's."""
    data = (DUMPS / "json.json").read_bytes()
    deep = tmp_path / "deep.json"
    deep.write_bytes(data.replace(b'\n  "meta"', b'\n  "x": ' + b"[" * 1000 + b"]" * 1000
                                  + b',\n  "meta"', 1))
    assert len(sacct(capsys, deep)["jobs"]) == 16
    at = data.index(b'"allocation_nodes": 1') + len(b'"allocation_nodes": ')
    path = tmp_path / "huge-number.json"
    path.write_bytes(data[:at] + b"1e400" + data[at + 1:])
    assert f"(char {at})" in refused(capsys, path)
