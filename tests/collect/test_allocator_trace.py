"""The allocator trace reader: records, defects, limits, the fast path's agreement, memory.

Every read here goes through :func:`read` which runs both the fast (batched)
path and the line-by-line path and requires the same result, so each defect
test also proves the fast path hands that defect over intact.
"""

from __future__ import annotations

import copy
import hashlib
import io
import random
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor._io import CHUNK_SIZE, HashingReader
from auditor.collect import allocator_fold, allocator_record, allocator_trace
from auditor.collect.allocator_record import phase_ok, sample_ok
from auditor.collect.allocator_trace import FAST_BATCH, FINDINGS_CAP, read_allocator_trace
from auditor.model import AllocatorTrace, PhaseRecord
from auditor.schema import validator
from tests.test_schemas import PHASE, SAMPLE

DEFECTS = Path(__file__).resolve().parents[2] / "fixtures" / "defects" / "allocator_trace"
T0 = 1789499900000000000


def read(data: bytes, path: str = "a.jsonl", **options: Any) -> AllocatorTrace:
    """Read ``data`` by both paths; they must agree. Also checks the hash."""
    stream = HashingReader(io.BytesIO(data))
    fast = read_allocator_trace(stream, path, **options)
    assert stream.digest().sha256 == hashlib.sha256(data).hexdigest()
    slow = read_allocator_trace(HashingReader(io.BytesIO(data)), path, fast=False, **options)
    assert fast == slow
    return fast


def fixture(name: str) -> AllocatorTrace:
    return read((DEFECTS / name).read_bytes(), name)


def line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


def sample(seq: int, **changes: Any) -> dict[str, Any]:
    return {**SAMPLE, "seq": seq, "sample_ns": T0 + seq, **changes}


def phase(seq: int, **changes: Any) -> dict[str, Any]:
    return {**PHASE, "seq": seq, "started_ns": T0 + seq, "finished_ns": T0 + seq + 1, **changes}


def rules(trace: AllocatorTrace) -> list[str]:
    return [f.rule_id for f in trace.findings]


def messages(trace: AllocatorTrace) -> list[str]:
    return [f.message for f in trace.findings]


# ------------------------------------------------------------------- valid


def test_valid_trace() -> None:
    data = b"".join([
        line(phase(0, phase="init_model", step=0)),
        line(sample(1, allocated_bytes=10, reserved_bytes=20)),
        line(sample(2, allocated_bytes=30, reserved_bytes=15)),
        line(phase(3, phase="rollout_init", step=1, error_type="torch.OutOfMemoryError",
                   error_message="CUDA out of memory", peak_allocated_bytes=None)),
        line(sample(4, allocated_bytes=5, reserved_bytes=25, note="extra fields are fine")),
    ])
    trace = read(data, "allocator-traces/allocator-3657525.jsonl")
    assert trace.findings == ()
    assert trace.lines == 5
    assert trace.samples == 3
    assert (trace.sample_peak_allocated_bytes, trace.sample_peak_reserved_bytes) == (30, 25)
    assert trace.pids == ((3657525, 1),)
    assert trace.ranks == ((0, 1),)
    assert (trace.first_ns, trace.last_ns) == (T0, T0 + 4)
    assert trace.phases == (
        PhaseRecord(
            path="allocator-traces/allocator-3657525.jsonl", line=1, pid=3657525, rank=0,
            role="actor_rollout", seq=0, phase="init_model", step=0, started_ns=T0,
            finished_ns=T0 + 1, error_type="", error_message="",
            peak_allocated_bytes=30000000000, peak_reserved_bytes=40000000000,
        ),
        PhaseRecord(
            path="allocator-traces/allocator-3657525.jsonl", line=4, pid=3657525, rank=0,
            role="actor_rollout", seq=3, phase="rollout_init", step=1, started_ns=T0 + 3,
            finished_ns=T0 + 4, error_type="torch.OutOfMemoryError",
            error_message="CUDA out of memory", peak_allocated_bytes=None,
            peak_reserved_bytes=40000000000,
        ),
    )


def test_phases_only_and_samples_only() -> None:
    phases = read(line(phase(0)) + line(phase(1)))
    assert (len(phases.phases), phases.samples, phases.sample_peak_allocated_bytes) == (2, 0, None)
    samples = read(line(sample(0)) + line(sample(1)))
    assert (len(samples.phases), samples.samples, samples.ranks) == (0, 2, ())


def test_crlf_lines_read_like_lf_lines() -> None:
    crlf = fixture("crlf_lines.jsonl")
    lf = read((DEFECTS / "crlf_lines.jsonl").read_bytes().replace(b"\r\n", b"\n"),
              "crlf_lines.jsonl")
    assert crlf.findings == ()
    assert (crlf.lines, len(crlf.phases), crlf.samples) == (4, 2, 2)
    assert crlf == lf


def test_escaped_phase_key_is_a_phase_even_among_samples() -> None:
    # The fast path skips the phase test for bytes without "h" or "\": this line
    # spells "phase" with escapes only, so the backslash must keep it a phase. It
    # also carries a sample's fields, so only the phase test tells it apart.
    escaped = (b'{"pid": 3657525, "rank": 0, "role": "r", "seq": 1, "sample_ns": 5, '
               b'"allocated_bytes": 1, "reserved_bytes": 1, '
               b'"\\u0070\\u0068\\u0061\\u0073\\u0065": "rollout_init", "step": 0, '
               b'"started_ns": 5, "finis\\u0068ed_ns": 6, "error_type": "OutOfMemoryError"}\n')
    assert b"h" not in escaped
    trace = read(line(sample(0, role="x")) + escaped + line(sample(2)))
    assert [(p.line, p.phase, p.error_type) for p in trace.phases] == [
        (2, "rollout_init", "OutOfMemoryError")]
    assert trace.samples == 2
    plain = line({**phase(1), "sample_ns": 5, "allocated_bytes": 1, "reserved_bytes": 1})
    trace = read(line(sample(0)) + plain + line(sample(2)))
    assert ([p.line for p in trace.phases], trace.samples) == ([2], 2)
    fixture_trace = fixture("escaped_phase_key.jsonl")
    assert [p.phase for p in fixture_trace.phases] == ["init_model", "rollout_init"]


def test_new_pid_is_booked_at_its_first_line() -> None:
    trace = fixture("foreign_pid.jsonl")
    assert trace.pids == ((3657525, 1), (4242, 3))
    assert trace.findings == ()


def test_many_pids_in_one_batch_are_all_booked() -> None:
    data = b"".join(line(sample(seq, pid=1000 + seq % 20)) for seq in range(100))
    trace = read(data)
    assert trace.pids == tuple((1000 + n, n + 1) for n in range(20))


def test_pids_past_the_cap_are_booked_in_line_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """When a batch brings more new pids than the cap leaves room for, the first ones
    by line are kept, as line by line."""
    monkeypatch.setattr(allocator_trace, "MAX_DISTINCT", 3)
    for pids in ([9, 2, 7, 1, 5], [1, 2, 3, 4, 5], [50, 40, 30, 20, 10]):
        trace = read(b"".join(line(sample(seq, pid=pid)) for seq, pid in enumerate(pids)))
        assert [pid for pid, _ in trace.pids] == pids[:3]
    # a phase record's pid too: a batch of samples and phase records, booked by line
    mixed = [line(sample(0, pid=1)), line(sample(1, pid=2)), line(phase(2, pid=3)),
             line(sample(3, pid=4)), line(phase(4, pid=5))]
    trace = read(b"".join(mixed))
    assert [pid for pid, _ in trace.pids] == [1, 2, 3]


def test_lines_across_read_chunks(tmp_path: Path) -> None:
    count = 3 * CHUNK_SIZE // 100
    data = b"".join(line(sample(seq, allocated_bytes=seq % 977, reserved_bytes=seq % 1009))
                    for seq in range(count))
    assert len(data) > 2 * CHUNK_SIZE
    trace = read(data)
    assert trace.findings == ()
    assert (trace.lines, trace.samples) == (count, count)
    assert (trace.sample_peak_allocated_bytes, trace.sample_peak_reserved_bytes) == (976, 1008)
    assert (trace.first_ns, trace.last_ns) == (T0, T0 + count - 1)


# ----------------------------------------------------------------- defects


def test_truncated_last_line_is_aud004_and_not_counted() -> None:
    trace = fixture("truncated_last_line.jsonl")
    assert (trace.lines, len(trace.phases), trace.samples) == (4, 1, 2)
    assert messages(trace) == [
        "truncated_last_line.jsonl:4: final line has no trailing newline; it is not valid "
        "JSON (writer cut off?) and is not counted"
    ]
    assert trace.findings[0].citations[0].line == 4
    assert trace.findings[0].severity == "warning"


def test_unterminated_last_line_that_parses_is_kept_with_aud004() -> None:
    trace = fixture("unterminated_last_line.jsonl")
    assert (trace.lines, len(trace.phases), trace.samples) == (4, 2, 2)
    assert [p.phase for p in trace.phases] == ["init_model", "actor_update"]
    assert messages(trace) == [
        "unterminated_last_line.jsonl:4: final line has no trailing newline; it parses and "
        "is kept"
    ]


def test_unterminated_last_line_that_parses_but_is_invalid() -> None:
    trace = read(line(sample(0)) + orjson.dumps(sample(1, allocated_bytes="x")))
    assert messages(trace) == [
        'a.jsonl:2: /allocated_bytes: expected integer or null, found string "x"',
        "a.jsonl:2: final line has no trailing newline; it parses but is not a usable record",
    ]
    assert trace.samples == 1


def test_non_json_line_is_aud003_and_its_neighbours_count() -> None:
    trace = fixture("non_json_line.jsonl")
    assert (trace.lines, len(trace.phases), trace.samples) == (5, 2, 2)
    (finding,) = trace.findings
    assert finding.rule_id == "AUD003"
    assert finding.message.startswith("non_json_line.jsonl:3: not a JSON object: unexpected "
                                      "character")
    assert finding.citations[0].quote == "Traceback (most recent call last):"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("not_object_line.jsonl", "not_object_line.jsonl:2: not a JSON object: found array"),
        ("blank_line.jsonl", "blank_line.jsonl:2: not a JSON object: empty line"),
        ("nul_bytes.jsonl", "nul_bytes.jsonl:2: not a JSON object: unexpected character"),
        ("invalid_utf8_line.jsonl", "invalid_utf8_line.jsonl:2: not a JSON object: str is not "
                                    "valid UTF-8"),
    ],
)
def test_lines_that_are_not_objects(name: str, message: str) -> None:
    trace = fixture(name)
    assert rules(trace) == ["AUD003"]
    assert trace.findings[0].message.startswith(message)
    assert len(trace.phases) + trace.samples == trace.lines - 1


def test_empty_file_is_aud010() -> None:
    trace = fixture("empty.jsonl")
    assert messages(trace) == ["empty.jsonl: file is empty"]
    assert (trace.lines, trace.samples, trace.phases, trace.first_ns) == (0, 0, (), None)


@pytest.mark.parametrize(
    ("name", "message", "phases", "samples"),
    [
        ("wrong_type_pid.jsonl", "wrong_type_pid.jsonl:2: /pid: expected integer, found "
                                 "boolean true", 1, 1),
        ("float_seq.jsonl", "float_seq.jsonl:2: /seq: expected integer, found number 1.0", 1, 1),
        ("negative_bytes.jsonl", "negative_bytes.jsonl:2: /allocated_bytes: -1 is less than the "
                                 "minimum of 0", 1, 1),
        ("missing_error_type.jsonl", "missing_error_type.jsonl:2: /error_type: required field "
                                     "missing", 1, 1),
        ("null_error_type.jsonl", "null_error_type.jsonl:2: /error_type: expected string, "
                                  "found null", 1, 1),
    ],
)
def test_wrong_field_types_are_aud002_with_the_line(
    name: str, message: str, phases: int, samples: int
) -> None:
    trace = fixture(name)
    assert messages(trace) == [message]
    assert trace.findings[0].citations[0].line == 2
    assert (len(trace.phases), trace.samples) == (phases, samples)


@pytest.mark.parametrize(
    ("field", "value"),
    [("pid", 0), ("pid", -5), ("sample_ns", -1), ("allocated_bytes", -1),
     ("reserved_bytes", -2), ("pid", True), ("sample_ns", 1.0), ("sample_ns", None)],
)
def test_the_same_bad_value_on_every_line(field: str, value: Any) -> None:
    trace = read(b"".join(line(sample(seq, **{field: value})) for seq in range(3)))
    assert rules(trace) == ["AUD002"] * 3
    assert {f.citations[0].pointer for f in trace.findings} == {f"/{field}"}
    assert trace.samples == 0


def test_phase_without_a_usable_error_type_is_not_kept() -> None:
    # A phase whose error_type is not a string must never read as "no error".
    for name in ("missing_error_type.jsonl", "null_error_type.jsonl"):
        assert [p.phase for p in fixture(name).phases] == ["init_model"]


def test_phase_with_bad_other_fields_is_kept_with_none() -> None:
    trace = read(line(phase(0, pid=True, peak_reserved_bytes="big")))
    (kept,) = trace.phases
    assert (kept.pid, kept.peak_reserved_bytes, kept.phase) == (None, None, "init_model")
    assert [f.citations[0].pointer for f in trace.findings] == ["/peak_reserved_bytes", "/pid"]


def test_sample_with_a_phase_key_is_judged_as_a_phase() -> None:
    trace = fixture("sample_with_null_phase.jsonl")
    assert set(rules(trace)) == {"AUD002"}
    assert "sample_with_null_phase.jsonl:2: /phase: expected string, found null" in messages(trace)
    assert trace.samples == 1


def test_started_after_finished_is_aud115() -> None:
    trace = fixture("started_after_finished.jsonl")
    assert messages(trace) == [
        "started_after_finished.jsonl:2: started_ns 1789499990000000000 is after finished_ns "
        "1789499980000000000"
    ]
    assert len(trace.phases) == 2


def test_seq_not_rising_is_aud115() -> None:
    trace = fixture("seq_not_rising.jsonl")
    assert messages(trace) == ["seq_not_rising.jsonl:3: seq 1 does not rise above 2"]
    assert (len(trace.phases), trace.samples) == (2, 2)


def test_seq_disorder_at_a_fast_batch_boundary() -> None:
    seqs = list(range(3 * FAST_BATCH))
    seqs[FAST_BATCH] = seqs[FAST_BATCH - 1]  # first line of the second batch repeats
    trace = read(b"".join(line(sample(seq)) for seq in seqs))
    assert messages(trace) == [
        f"a.jsonl:{FAST_BATCH + 1}: seq {FAST_BATCH - 1} does not rise above {FAST_BATCH - 1}"
    ]


def test_findings_are_capped_with_one_aud013() -> None:
    data = line(sample(0)) + b"garbage\n" * (FINDINGS_CAP + 50) + b'{"cut'
    trace = read(data)
    assert rules(trace) == ["AUD003"] * FINDINGS_CAP + ["AUD004", "AUD013"]
    assert trace.findings[-1].message == (
        f"a.jsonl: 50 further findings not kept (cap {FINDINGS_CAP})"
    )
    assert trace.findings[FINDINGS_CAP - 1].citations[0].line == FINDINGS_CAP + 1
    assert trace.samples == 1


def test_line_longer_than_the_limit_is_aud007() -> None:
    long = line(sample(1, note="x" * 300))
    trace = read(line(sample(0)) + long + line(sample(2)), max_line=200)
    assert messages(trace) == [f"a.jsonl:2: line of {len(long) - 1} bytes clipped to 200"]
    assert trace.samples == 2


def test_line_longer_than_a_read_chunk(tmp_path: Path) -> None:
    long = line(sample(1, note="x" * (CHUNK_SIZE + 10)))
    trace = read(line(sample(0)) + long + line(sample(2)) + b"x" * (2 * CHUNK_SIZE))
    assert messages(trace) == [
        f"a.jsonl:2: line of {len(long) - 1} bytes clipped to {CHUNK_SIZE}",
        f"a.jsonl:4: line of {2 * CHUNK_SIZE} bytes clipped to {CHUNK_SIZE}",
        "a.jsonl:4: final line has no trailing newline; the line is too long to parse and is "
        "not counted",
    ]
    assert (trace.lines, trace.samples) == (4, 2)


def test_random_bytes_never_raise() -> None:
    generator = random.Random(7)
    pieces = [line(sample(1)), line(phase(2)), b"\n", b"\r\n", b"{", b"}", b'"phase"', b"-1",
              b"true", b"\xff", b"\x00", b"[1]", b'"seq": 3', b",", b"h", b"\\"]
    for _ in range(300):
        data = b"".join(generator.choice(pieces) for _ in range(generator.randint(0, 30)))
        trace = read(data)
        assert trace.lines == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


# --------------------------------------------- the fast check == the schema


def _mutations(base: dict[str, Any]) -> list[dict[str, Any]]:
    values: list[Any] = [True, False, None, 1.0, 1.5, -1, 0, 1, "1", "", [], {}, 2**63]
    out = []
    for key in list(base) + ["error_message", "phase", "rank"]:
        without = copy.deepcopy(base)
        without.pop(key, None)
        out.append(without)
        for value in values:
            out.append({**base, key: value})
    return out


@pytest.mark.parametrize("form", ["phase", "sample"])
def test_fast_checks_agree_with_the_schema(form: str) -> None:
    base = PHASE if form == "phase" else SAMPLE
    check = validator("allocator-record")
    for record in _mutations(base):
        expected = check.is_valid(record)
        actual = phase_ok(record) if "phase" in record else sample_ok(record)
        assert actual == expected, record


def test_mutated_records_through_both_paths() -> None:
    records = _mutations(PHASE) + _mutations(SAMPLE)
    generator = random.Random(3)
    generator.shuffle(records)
    data = b"".join(line(sample(seq)) + line(record) for seq, record in enumerate(records))
    trace = read(data)  # both paths agree on every finding, phase and fold
    assert trace.samples >= len(records)
    assert "AUD002" in rules(trace)


def test_mixed_generated_trace_both_paths_agree() -> None:
    generator = random.Random(11)
    parts = []
    seq = 0
    for _ in range(5000):
        seq += generator.choice([1, 1, 1, 2, 0, -3])
        roll = generator.random()
        if roll < 0.9:
            parts.append(line(sample(seq, allocated_bytes=generator.randint(0, 10**12))))
        elif roll < 0.97:
            parts.append(line(phase(seq, step=generator.randint(0, 3))))
        else:
            parts.append(generator.choice([b"oops\n", b"[]\n", line(sample(seq, pid=False))]))
    trace = read(b"".join(parts))
    assert trace.samples > 4000
    assert {"AUD115", "AUD003"} <= set(rules(trace))


# ------------------------------------------------- the sample path (text form)

_FORMS = (
    '{{"pid":{},"seq":{},"sample_ns":{},"allocated_bytes":{},"reserved_bytes":{}}}',
    '{{"pid": {}, "seq": {}, "sample_ns": {}, "allocated_bytes": {}, "reserved_bytes": {}}}',
)
_ODD_VALUES = (
    "", "0", "00", "01", "007", "-0", "-1", "1.0", "1.", ".5", "1e3", "1E3", "0e0", '"1"', "true",
    "false", "null", "[]", "{}", "[1]", " 1", "1 ", "\t1", "9" * 19, "1" + "0" * 19,
    str(2**63 - 1), str(2**63), str(2**64 - 1), str(2**64), "9" * 21, "１", "0x1f", "+1",
    "NaN", "Infinity", "1\r",
)


def _sample_text(form: str, values: list[str]) -> bytes:
    return form.format(*values).encode()


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_sample_path_agrees_with_the_record_path_on_near_samples(data: st.DataObject) -> None:
    """Lines one edit away from a well-formed sample, in batches of well-formed ones:
    the text-form path must take exactly what the line-by-line path accepts, and fold it
    the same (``read`` compares the two)."""
    form_index = data.draw(st.integers(0, 1))
    count = data.draw(st.integers(1, 2 * FAST_BATCH + 3))
    odd = data.draw(st.lists(st.integers(0, count - 1), max_size=3))
    lines = []
    for number in range(count):
        values = [str(7 + number % 2 * data.draw(st.integers(0, 1))), str(number * 3),
                  str(T0 + number), str(number * 1000), "0"]
        form = _FORMS[form_index]
        if number in odd:
            kind = data.draw(st.sampled_from(["value", "form", "phase", "line", "seq"]))
            if kind == "value":
                values[data.draw(st.integers(0, 4))] = data.draw(st.sampled_from(_ODD_VALUES))
            elif kind == "form":
                form = _FORMS[1 - form_index]
            elif kind == "seq":
                values[1] = str(data.draw(st.integers(0, count * 3)))
        text = _sample_text(form, values)
        if number in odd and kind == "phase":
            text = orjson.dumps(phase(number * 3))
        elif number in odd and kind == "line":
            text = data.draw(st.sampled_from(
                [b"", b" " + text, text + b" ", text + b"\r", text[:-1],
                 text.replace(b":", b": ", 1), text.replace(b'"pid"', b'"p\\u0069d"'),
                 text + text, b"[" + text + b"]"]))
        lines.append(text + b"\n")
    read(b"".join(lines))


_SWAPS = ((b'"pid"', b'"pie"'), (b'"seq"', b'"Seq"'), (b'"pid":', b'"seq":'),
          (b'"reserved_bytes"', b'"reserved_bytez"'), (b",", b" ,"), (b"{", b"[{"))


@pytest.mark.parametrize("form", _FORMS)
def test_sample_path_refuses_every_odd_value_and_key(form: str) -> None:
    """Each odd value in each of the five places, and each misspelt, swapped or respaced
    key, amid well-formed samples: both paths agree (a line the sample path wrongly took
    would fold a value the line-by-line path reports as AUD002)."""
    def batch(values: list[str], swap: tuple[bytes, bytes] | None = None) -> bytes:
        lines = [_sample_text(form, ["7", str(seq * 3), str(T0 + seq), str(seq), "5"])
                 for seq in range(12)]
        odd = _sample_text(form, values)
        lines[6] = odd if swap is None else odd.replace(*swap)
        return b"\n".join(lines) + b"\n"

    for place in range(5):
        for value in _ODD_VALUES:
            values = ["7", "18", str(T0 + 6), "6", "5"]
            values[place] = value
            read(batch(values))
    for swap in _SWAPS:
        trace = read(batch(["7", "18", str(T0 + 6), "6", "5"], swap))
        assert bool(trace.findings) == (swap[1] != b" ,"), swap  # respaced is still valid


def test_a_negative_seq_after_an_invalid_line_is_refused_by_every_path() -> None:
    """An invalid line can leave a negative ``seq`` behind; a sample whose ``seq`` is
    negative yet rises above it is still invalid (AUD002), whether it shares a batch with
    other samples, follows a phase record cut from the chunk, or comes in its own read."""
    samples = b"".join(line(sample(seq)) for seq in range(10))
    odd = line({**sample(0), "seq": -1})
    for before in (b'{"seq":-2,"phase":"x"}\n', b'{"seq":-2}\n'):
        for data in (before + odd + samples, before + odd):
            trace = read(data)
            assert trace.samples == data.count(b"sample_ns") - 1
            assert any(f.rule_id == "AUD002" and f.citations[0].line == 2
                       for f in trace.findings), trace.findings


@pytest.mark.parametrize("form", _FORMS)
def test_sample_path_values_past_63_bits_beside_two_to_the_63(form: str) -> None:
    """orjson reads the negated text of a value past ``2**63`` as a float that can equal
    ``-2**63`` itself: with both in one column, the least value need not be the float.
    The sample path must still leave such a batch to the record path, whatever the order
    (both paths agree). Every integer field is 64-bit (issue 41): such values are findings
    naming their lines, never a peak."""
    big = [str(2**63), str(2**63 + 1), str(2**63 + 1000), str(2**64 - 1)]
    for place in range(5):
        for pair in ((big[0], big[1]), (big[1], big[0]), (big[0], big[2]), (big[3], big[0])):
            lines = []
            for seq in range(12):
                values = ["7", str(seq * 3), str(T0 + seq), str(seq), "5"]
                if seq in (5, 6):
                    values[place] = pair[seq - 5]
                if place == 1 and seq > 6:  # seq must keep rising past the big ones
                    values[1] = str(2**64 + seq)
                lines.append(_sample_text(form, values))
            trace = read(b"\n".join(lines) + b"\n")
            flagged = {f.citations[0].line for f in trace.findings if f.rule_id == "AUD002"}
            assert {6, 7} <= flagged, (place, pair, trace.findings)
            if place == 3:
                assert trace.sample_peak_allocated_bytes == 11  # (seq 11's; 5 and 6 are out)
            if place == 4:
                assert trace.sample_peak_reserved_bytes == 5


@pytest.mark.parametrize("form", _FORMS)
def test_sample_path_refuses_digits_out_of_their_places(form: str) -> None:
    """A digit inserted anywhere in a line, or a value's digits moved anywhere (leaving
    its place empty), keeps the line's shape without digits: only the line-by-line
    path can tell where the digits stand, and both paths must agree."""
    values = ["7", "18", str(T0 + 6), "6", "5"]
    good = [_sample_text(form, ["7", str(seq * 3), str(T0 + seq), str(seq), "5"])
            for seq in range(12)]
    line_text = _sample_text(form, values)
    variants = {line_text[:at] + b"9" + line_text[at:] for at in range(len(line_text) + 1)}
    for place in range(5):
        emptied = _sample_text(form, [v if i != place else "" for i, v in enumerate(values)])
        moved = values[place].encode()
        variants.update(emptied[:at] + moved + emptied[at:] for at in range(len(emptied) + 1))
    assert len(variants) > 300
    for variant in sorted(variants):
        lines = [*good[:6], variant, *good[7:]]
        read(b"\n".join(lines) + b"\n")


def test_fold_is_the_seam_and_its_two_ways_agree() -> None:
    """``fold`` looks only: it gives what a text adds (the same by its sample and record
    ways), or None, whatever the trace so far, for the record-by-record way to take."""
    text = b"".join(line(sample(seq, pid=7 + (seq > 4))) for seq in range(10))
    folded = allocator_fold.fold(text)
    lines = text.split(b"\n")[:-1]
    by_records = allocator_fold._fold_records(lines, -1, allocator_fold._hints(text))
    assert folded is not None and folded == by_records
    assert (folded.lines, folded.samples, folded.last_seq) == (10, 10, 9)
    assert list(folded.steps) == [(0, 7), (5, 8)]
    assert allocator_fold.fold(text, after=0) is None  # the first seq must rise above
    assert allocator_fold.fold(text + b"oops\n") is None
    mixed = line(phase(10)) + line(sample(11))
    folded = allocator_fold.fold(mixed, after=9)
    assert folded is not None and folded.samples == 1 and folded.steps[0][0] == 0


def test_sample_path_takes_whole_batches_of_samples_around_phase_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cheap path serves every well-formed sample, in either written form; only the
    phase records go record by record (one call each), and nothing goes line by line."""
    record_calls: list[int] = []
    fold_records = allocator_fold._fold_records

    def counted(lines: list[bytes], *rest: Any) -> Any:
        record_calls.append(len(lines))
        return fold_records(lines, *rest)

    def never(*_: Any) -> None:
        raise AssertionError("a valid trace went line by line")

    monkeypatch.setattr(allocator_fold, "_fold_records", counted)
    monkeypatch.setattr(allocator_trace, "_slow_batch", never)
    for form in _FORMS:
        record_calls.clear()
        lines = []
        for seq in range(3000):
            if seq % 700 == 5:
                lines.append(line(phase(seq)))
            else:
                pid = SAMPLE["pid"] + (seq > 1500)  # a second process half way
                lines.append(_sample_text(form, [str(pid), str(seq), str(T0 + seq),
                                                 str(seq * 10), str(seq * 20)]) + b"\n")
        trace = read_allocator_trace(HashingReader(io.BytesIO(b"".join(lines))), "a.jsonl")
        assert (trace.samples, len(trace.phases), trace.findings) == (2995, 5, ())
        assert trace.pids == ((SAMPLE["pid"], 1), (SAMPLE["pid"] + 1, 1502))
        assert trace.sample_peak_reserved_bytes == 2999 * 20
        assert (trace.first_ns, trace.last_ns) == (T0, T0 + 2999)
        assert record_calls == [1] * 5


# ------------------------------------------------------------------ memory


def test_big_trace_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "allocator-1.jsonl"
    template = line(sample(0)).replace(b'"seq":0', b'"seq":%d')
    assert b"%d" in template
    count = 50 * 10**6 // len(template) + 1
    with path.open("wb") as handle:
        for start in range(0, count, 10_000):
            handle.write(b"".join(template % seq for seq in range(start, start + 10_000)))
    size = path.stat().st_size
    assert size >= 50 * 10**6
    tracemalloc.start()
    try:
        with path.open("rb") as handle:
            trace = read_allocator_trace(HashingReader(handle), "allocator-1.jsonl")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert trace.findings == ()
    assert trace.samples == trace.lines >= count
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB trace"


def test_module_constants() -> None:
    assert allocator_trace.MAX_LINE == CHUNK_SIZE
    assert FINDINGS_CAP == 100


def test_the_written_sample_forms_come_from_the_schema() -> None:
    """The fast path's forms are derived from the schema's sample fields, in order."""
    assert allocator_record.SAMPLE_FIELDS == tuple(SAMPLE)
    assert allocator_record.SAMPLE_FORMS == tuple(
        form.format(*[""] * 5).encode() + b"\n" for form in _FORMS)
    phase_keys = [check.key for check in allocator_record.PHASE_CHECKS]
    assert set(phase_keys) >= set(PHASE)


def test_phase_records_are_capped_keeping_first_and_last() -> None:
    import io

    from auditor._io import HashingReader
    from auditor.collect import allocator_trace

    cap = allocator_trace.PHASES_CAP
    lines = [
        b'{"pid":1,"rank":0,"role":"a","seq":%d,"phase":"actor_update","step":%d,'
        b'"started_ns":%d,"finished_ns":%d,"error_type":""}' % (i, i, i, i)
        for i in range(cap + 1000)
    ]
    trace = allocator_trace.read_allocator_trace(
        HashingReader(io.BytesIO(b"\n".join(lines) + b"\n")), "t/allocator-1.jsonl")
    assert len(trace.phases) == cap
    assert trace.phases[0].step == 0 and trace.phases[-1].step == cap + 999
    capped = [f for f in trace.findings if f.rule_id == "AUD016"]
    assert len(capped) == 1 and "1000 phase records" in capped[0].message


def test_phase_records_share_their_repeated_names() -> None:
    """A long run keeps thousands of phase records per trace: each role, phase and error
    type is stored once, not once per record."""
    lines = [
        b'{"pid":4242,"rank":0,"role":"actor_rollout","seq":%d,"phase":"rollout_generate",'
        b'"step":%d,"started_ns":%d,"finished_ns":%d,"error_type":"torch.OutOfMemoryError"}'
        % (i, i, 1_789_498_843_354_362_359 + i, 1_789_498_843_954_362_359 + i)
        for i in range(5000)
    ]
    data = b"\n".join(lines) + b"\n"
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        trace = allocator_trace.read_allocator_trace(HashingReader(io.BytesIO(data)), "t.jsonl")
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(trace.phases) == 5000
    first, last = trace.phases[0], trace.phases[-1]
    assert first.role is last.role and first.phase is last.phase
    assert first.error_type is last.error_type
    assert kept < 420 * len(lines)  # about 340 bytes a record; 530 with a copy of each name


def test_a_phase_record_with_a_key_twice_is_aud003_and_not_kept() -> None:
    """orjson keeps a repeated key's last value: a raised error_type followed by an empty
    one would read as a phase that returned. Such a record is refused (AUD003) by both
    paths, among a batch of samples fast enough to go the fast way."""
    doubled = line(phase(100, error_type="torch.OutOfMemoryError")).replace(
        b'"error_type":"torch.OutOfMemoryError"',
        b'"error_type":"torch.OutOfMemoryError","error_type":""')
    data = b"".join([*(line(sample(seq)) for seq in range(100)), doubled,
                     *(line(sample(seq)) for seq in range(101, 300)), line(phase(300))])
    trace = read(data)
    assert [(p.line, p.error_type) for p in trace.phases] == [(301, "")]
    assert [(f.rule_id, f.citations[0].line) for f in trace.findings] == [("AUD003", 101)]
    assert "a key appears twice" in messages(trace)[0]


def test_unmeasured_samples_count_and_leave_the_peaks_unknown() -> None:
    """Contract v1.1: a sample written without a GPU carries null bytes ("not measured"):
    it is no finding, it counts as a sample, and the peaks stay unknown, never 0; a measured
    sample among them sets the peak."""
    lines = [orjson.dumps({"pid": 7, "seq": i, "sample_ns": 100 + i, "allocated_bytes": None,
                           "reserved_bytes": None}) for i in range(3)]
    trace = read(b"\n".join(lines) + b"\n")
    assert not trace.findings and trace.samples == 3
    assert trace.sample_peak_allocated_bytes is None and trace.sample_peak_reserved_bytes is None
    measured = orjson.dumps({"pid": 7, "seq": 3, "sample_ns": 104, "allocated_bytes": 5,
                             "reserved_bytes": 9})
    trace = read(b"\n".join([*lines, measured]) + b"\n")
    assert (trace.sample_peak_allocated_bytes, trace.sample_peak_reserved_bytes) == (5, 9)


def test_a_terminal_record_is_read_with_its_line_and_a_broken_one_is_a_finding() -> None:
    """Contract v1.2: a rank's own ``{"kind": "terminal", "step": N}`` record (written by
    ``Trace.terminal``) counts beside the phases and samples; one without a step or pid is
    a finding naming its line, never a terminal event."""
    terminal = {"kind": "terminal", "pid": 7, "rank": 0, "role": "policy", "host": "n2",
                "seq": 2, "step": 3, "recorded_ns": 5}
    data = line(phase(0)) + line(sample(1)) + line(terminal) \
        + line({**terminal, "seq": 3, "step": "3"}) + line(sample(4))
    trace = read(data)
    assert trace.terminals == ((3, 3),)
    assert [(f.rule_id, f.citations[0].line) for f in trace.findings] == [("AUD002", 4)]
    assert trace.samples == 2 and len(trace.phases) == 1


def test_a_parameter_digest_is_read_and_a_malformed_one_is_a_finding() -> None:
    params = {"kind": "params", "pid": 7, "rank": 0, "seq": 1, "step": 1, "when": "after",
              "digest": "ab" * 32, "tensors": 4, "sampled_bytes": 1024}
    data = line(phase(0)) + line(params) + line({**params, "seq": 2, "when": "during"})
    trace = read(data)
    assert trace.params == ((1, "after", "ab" * 32, 2),)
    assert [(f.rule_id, f.citations[0].line) for f in trace.findings] == [("AUD002", 3)]
