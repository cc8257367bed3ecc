"""Property-based robustness: no input crashes a collector or the audit, no finding is lost.

Collectors get arbitrary bytes; whole audits get studies mutated at random
(byte flips, truncation, deletion, duplicated or reordered lines, duplicated
files). Each case asserts: the audit exits 0 with findings (never a traceback),
the evidence tree's bytes and mtimes are unchanged, the damaged file is named
by a finding, and a period whose evidence was damaged never ends ``resolved``.

The default profile runs a bounded number of examples (fast, in CI); run the
long one with ``HYPOTHESIS_PROFILE=long pytest tests/test_fuzz.py``.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, cast

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor._cli import main
from auditor._io import HashingReader
from auditor.collect.allocator_trace import read_allocator_trace
from auditor.collect.device import read_device
from auditor.collect.period import read_period
from auditor.collect.protocol import read_protocol
from auditor.collect.sacct import parse_sacct
from auditor.collect.training_log import scan_training_log
from auditor.collect.trial import read_trial
from auditor.errors import SacctFormatError
from tests.helpers import outcome_study, snapshot

JSONISH = st.one_of(
    st.binary(max_size=2000),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
        | st.text(max_size=20),
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["pid", "rank", "role", "job_id", "phase", "step",
                                           "seq", "started_ns", "finished_ns", "evidence",
                                           "attempts", "workers", "invocation", "gpu",
                                           "exit_code", "path", "sha256", "size", "kind"]),
                          children, max_size=6),
        max_leaves=20,
    ).map(lambda doc: __import__("orjson").dumps(doc)),
)


def _reader(data: bytes) -> HashingReader:
    return HashingReader(io.BytesIO(data))


@given(JSONISH)
def test_json_collectors_never_raise(data: bytes) -> None:
    for read, path in ((read_trial, "a/trial-1.json"), (read_device, "a/worker-x-0-1.json"),
                       (read_protocol, "protocol.json"),
                       (read_period, "pairs/p/period-1.json")):
        record = read(_reader(data), path)
        assert record is not None


@given(st.lists(st.one_of(JSONISH, st.binary(max_size=200)), max_size=20),
       st.sampled_from([b"\n", b"\r\n", b""]))
def test_allocator_trace_never_raises(lines: list[bytes], end: bytes) -> None:
    data = b"\n".join(lines) + end
    trace = read_allocator_trace(_reader(data), "t/allocator-1.jsonl")
    assert trace.lines >= 0


@given(st.binary(max_size=5000), st.one_of(st.none(), st.integers(-3, 1000)))
def test_training_log_never_raises(data: bytes, steps: int | None) -> None:
    scan = scan_training_log(_reader(data), "training-1.log", steps)
    assert scan.lines == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


@given(st.binary(max_size=3000), st.sampled_from([None, "|", "^|^", ","]))
def test_sacct_never_raises_anything_but_its_refusal(data: bytes, delimiter: str | None) -> None:
    try:
        parse_sacct(_reader(data), "sacct.psv", None, delimiter)
    except SacctFormatError as error:
        assert str(error)


# ------------------------------------------------------------ mutated studies

_BASE: dict[str, Path] = {}


def _base() -> Path:
    if "root" not in _BASE:
        root = Path(tempfile.mkdtemp(prefix="fuzz-base-")) / "study"
        outcome_study(root, ["completed", "rollout_init_oom"])
        _BASE["root"] = root
    return _BASE["root"]


def _evidence_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and "/attempt-" in p.as_posix())


MUTATIONS = ["flip", "truncate", "delete", "duplicate_line", "reorder_lines", "copy_file"]


def _mutate(root: Path, rel: str, how: str, position: float) -> str | None:
    """Damage ``rel``; returns the path a finding must name (None: mutation was a no-op)."""
    path = root / rel
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    if how == "flip" and data:
        at = int(position * (len(data) - 1))
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1:])
    elif how == "truncate" and data:
        path.write_bytes(data[: int(position * (len(data) - 1))])
    elif how == "delete":
        path.unlink()
    elif how == "duplicate_line" and lines:
        at = int(position * (len(lines) - 1))
        path.write_bytes(b"".join(lines[:at + 1] + lines[at:]))
    elif how == "reorder_lines" and len(lines) > 1 and lines[0] != lines[-1]:
        path.write_bytes(b"".join(lines[1:] + lines[:1]))
    elif how == "copy_file":
        copy = path.with_name("copy-of-" + path.name)
        shutil.copyfile(path, copy)
        return copy.relative_to(root).as_posix()
    else:
        return None
    changed = not path.exists() or path.read_bytes() != data
    return rel if changed else None


@given(st.integers(0, 10_000), st.sampled_from(MUTATIONS), st.floats(0, 1))
def test_mutated_study_is_audited_and_damage_is_found(pick: int, how: str,
                                                      position: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "study"
        shutil.copytree(_base(), root)
        files = _evidence_files(root)
        rel = files[pick % len(files)]
        named = _mutate(root, rel, how, position)
        before = snapshot(root)
        out = Path(tmp) / "out"
        code = main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots",
                     "--jobs", "1"])
        assert code == 0
        assert snapshot(root) == before
        if named is None:
            return
        findings = pd.read_parquet(out / "findings.parquet")
        cited = set(findings["path"].dropna()) | set(findings["subject"])
        assert named in cited, (how, named)
        evidence = pd.read_parquet(out / "evidence.parquet")
        row = evidence[evidence["path"] == named]
        assert not row.empty and row.iloc[0]["status"] != "verified"
        periods = pd.read_parquet(out / "periods.parquet")
        damaged_pair = row.iloc[0]["pair"]
        touched = periods[periods["pair"] == damaged_pair] if how != "copy_file" else \
            periods.iloc[0:0]
        assert (touched["verdict"] != "resolved").all()


@pytest.mark.parametrize("how", MUTATIONS)
def test_mutations_of_period_records(tmp_path: Path, how: str) -> None:
    root = tmp_path / "study"
    shutil.copytree(_base(), root)
    record = sorted((root / "pairs").glob("*/period-*.json"))[0]
    rel = record.relative_to(root).as_posix()
    _mutate(root, rel, how, 0.5)
    code = main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet", "--no-plots"])
    assert code == 0


_VALID_TRIAL = __import__("orjson").loads(next(
    (Path(__file__).resolve().parents[1] / "fixtures" / "example_study").glob(
        "*/attempt-*/trial-*.json")).read_bytes())


@given(st.sampled_from(sorted(_VALID_TRIAL)),
       st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40), st.floats(),
                 st.text(max_size=5), st.lists(st.integers(), max_size=2)))
def test_fast_schema_check_agrees_with_jsonschema(key: str, value: object) -> None:
    """The compiled fast path may only skip documents jsonschema also finds valid."""
    from auditor.schema import _checker_for, is_valid_fast, problems

    doc = dict(_VALID_TRIAL)
    doc[key] = value
    if is_valid_fast("trial", doc):
        assert problems(_checker_for("trial", doc), doc) == []


def _fields(doc: dict, prefix: str = "") -> list[str]:
    """JSON pointers of every field, one level into objects (and the first list item)."""
    out = []
    for key, value in doc.items():
        pointer = f"{prefix}/{key}"
        out.append(pointer)
        if isinstance(value, dict) and not prefix:
            out.extend(_fields(value, pointer))
        elif isinstance(value, list) and value and isinstance(value[0], dict) and not prefix:
            out.extend(_fields(value[0], f"{pointer}/0"))
    return out


def _set(doc: dict, pointer: str, value: object) -> None:
    parts = pointer.strip("/").split("/")
    node: object = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]  # type: ignore[index]
    node[parts[-1]] = value  # type: ignore[index]


def _wrong(value: object) -> object:
    return {"not": "this"} if isinstance(value, list) else ["not", "this"]


def _cases() -> list[tuple[str, str]]:
    root = _base()
    cases = []
    for pattern in ("*-4gpu/attempt-*/trial-*.json",
                    "*-4gpu/attempt-*/device-evidence/*-0-*.json",
                    "pairs/*-s161/period-1.json"):
        path = sorted(root.glob(pattern))[0]
        doc = __import__("orjson").loads(path.read_bytes())
        cases += [(path.relative_to(root).as_posix(), p) for p in _fields(doc)]
    return cases


@pytest.mark.parametrize(("rel", "pointer"), _cases())
def test_wrong_type_at_every_field(tmp_path: Path, rel: str, pointer: str) -> None:
    """Every field of the trial, device and period records, given a value of the wrong type
    (the manifest kept consistent): a finding at that pointer, and the period cannot resolve."""
    import orjson

    from tests.helpers import edit_json

    root = tmp_path / "study"
    shutil.copytree(_base(), root)
    original = orjson.loads((root / rel).read_bytes())
    node: object = original
    for part in pointer.strip("/").split("/"):
        node = node[int(part)] if isinstance(node, list) else node[part]  # type: ignore[index]
    if rel.startswith("pairs/"):
        from tests.helpers import edit_record

        edit_record(root / rel, lambda doc: _set(doc, pointer, _wrong(node)))
    else:
        edit_json(root, rel, lambda doc: _set(doc, pointer, _wrong(node)))
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet",
                 "--no-plots"]) == 0
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    mine = findings[(findings["path"] == rel)]
    listed = {f"{p}" for p in mine["pointer"].dropna()}
    known_schema_field = not pointer.startswith(("/dispatch/", "/env/"))
    if known_schema_field:
        assert any(pointer.startswith(p) or p.startswith(pointer) for p in listed), listed
        periods = pd.read_parquet(tmp_path / "out" / "periods.parquet")
        pair = rel.split("/")[1] if rel.startswith("pairs/") else rel.split("-4gpu/")[0]
        assert (periods[periods["pair"] == pair]["verdict"] != "resolved").all()


# ------------------------------------------------------------ short reads

class _Trickle(io.RawIOBase):
    """A raw file that returns fewer bytes than asked, as an unbuffered file may."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self._data = memoryview(data)
        self._sizes = sizes or [1]
        self._at = 0
        self._calls = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        step = self._sizes[self._calls % len(self._sizes)]
        self._calls += 1
        stop = len(self._data) if size < 0 else self._at + min(size, step)
        chunk = bytes(self._data[self._at:stop])
        self._at += len(chunk)
        return chunk


_SAMPLES = {
    "trace": "host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-*/allocator-traces/allocator-*.jsonl",
    "log": "host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-*/training-*.log",
    "trial": "host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-*/trial-*.json",
    "device": "host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-*/device-evidence/worker-*.json",
    "sacct": "accounting/sacct-raw.psv",
}


@given(st.sampled_from(sorted(_SAMPLES)), st.lists(st.integers(1, 300), min_size=1, max_size=8),
       st.binary(max_size=40), st.floats(0, 1))
def test_short_reads_change_nothing(kind: str, sizes: list[int], insert: bytes,
                                    where: float) -> None:
    from tests.helpers import EXAMPLE

    data = next(EXAMPLE.glob(_SAMPLES[kind])).read_bytes()
    at = int(len(data) * where)
    data = data[:at] + insert + data[at:]
    read = {
        "trace": lambda r: read_allocator_trace(r, "t/allocator-1.jsonl", max_line=120),
        "log": lambda r: scan_training_log(r, "t/training-1.log", 1, max_line=90),
        "trial": lambda r: read_trial(r, "t/trial-1.json"),
        "device": lambda r: read_device(r, "t/device-evidence/worker-actor_rollout-0-1.json"),
        "sacct": lambda r: parse_sacct(r, "sacct.psv", None, None),
    }[kind]

    def run(reader: HashingReader) -> tuple[object, object]:
        try:
            result: object = read(reader)
        except SacctFormatError as error:
            result = str(error)
        reader.drain()
        return result, reader.digest()

    assert run(HashingReader(cast(BinaryIO, _Trickle(data, sizes)))) == run(_reader(data))


@given(st.binary(max_size=5000), st.lists(st.integers(1, 300), min_size=1, max_size=8),
       st.integers(0, 5000))
def test_draining_after_short_reads_hashes_every_byte(data: bytes, sizes: list[int],
                                                      parsed: int) -> None:
    """A parser may stop anywhere; drain() must hash the rest, however short the reads."""
    import hashlib

    reader = HashingReader(cast(BinaryIO, _Trickle(data, sizes)))
    taken = 0
    while taken < parsed and (chunk := reader.read(min(64, parsed - taken) or 1)):
        taken += len(chunk)
    reader.drain()
    assert reader.digest().sha256 == hashlib.sha256(data).hexdigest()
    assert reader.digest().size == len(data)
