"""Tests for :mod:`auditor.collect.training_log`.

Three layers: every real log in ``fixtures/real-evidence/logs`` against the
facts its ``SOURCES.md`` states; the tiny defect fixtures under
``fixtures/defects/training_log/`` (one defect each); and large inputs
generated in ``tmp_path`` (a 100 MB line, 200k lines) for bounded memory.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor import _io
from auditor import rules as table
from auditor._io import DEFAULT_MAX_LINE, HashingReader
from auditor.collect import failure_texts, log_events, training_log
from auditor.collect.log_events import STEP_LINES_KEPT
from auditor.collect.terminal import matcher
from auditor.collect.training_log import scan_training_log
from auditor.model import Citation, TrainingLogScan
from auditor.model.presets import TerminalSpec
from tests.collect.test_lines import plain_lines

REPO = Path(__file__).resolve().parents[2]
DEFECTS = REPO / "fixtures" / "defects" / "training_log"
REAL_LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "real-evidence" / "logs"

LEGACY_PATTERN = r"^\s*step:(?P<step>\d+) - "
"""A protocol override for verl logs older than the ``training/global_step`` key."""


def scan_file(
    path: Path, expected_steps: int | None, pattern: str | None = None, **limits: int
) -> TrainingLogScan:
    with path.open("rb") as handle:
        return scan_training_log(handle, path.name, expected_steps, pattern,
                                 max_events=limits.get("max_events", 200),
                                 max_line=limits.get("max_line", DEFAULT_MAX_LINE))


def scan_bytes(
    data: bytes,
    expected_steps: int | None,
    pattern: str | None = None,
    max_events: int = 200,
    max_line: int = 65536,
) -> TrainingLogScan:
    stream = io.BytesIO(data)
    return scan_training_log(
        stream, "training-1.log", expected_steps, pattern, max_events, max_line
    )


def kinds(scan: TrainingLogScan, *wanted: str) -> list[tuple[str, int, str]]:
    """(kind, line, detail) of the scan's events, optionally only of some kinds."""
    return [(e.kind, e.line, e.detail) for e in scan.events if not wanted or e.kind in wanted]


def rules(scan: TrainingLogScan) -> list[tuple[str, int | None]]:
    return [(f.rule_id, f.citations[0].line) for f in scan.findings]


FAILURE_KINDS = (
    "traceback",
    "exception",
    "gpu_oom",
    "host_oom",
    "kv_cache_init_failure",
    "nccl_timeout",
    "slurm_cancelled",
    "slurm_step_cancelled",
    "slurm_time_limit",
    "coordinated_shutdown",
)


# ----------------------------------------------------------------- real logs


def _megatron_complete(path: Path) -> None:
    scan = scan_file(path, 105)
    assert scan.lines == 1369
    assert scan.terminal_event is not None
    assert (scan.terminal_event.line, scan.terminal_event.detail) == (1366, "105")
    assert scan.terminal_event.text.startswith("(TaskRunner pid=20910) step:105 - ")
    assert "\x1b" not in scan.terminal_event.text
    assert scan.last_step == 105
    assert kinds(scan, *FAILURE_KINDS) == []  # 127 \r tqdm lines, dedup, raylet noise
    assert scan_file(path, 1).terminal_event is not None  # step:1 is a training line too
    assert scan_file(path, 106).terminal_event is None
    assert scan_file(path, None).last_step == 105


def _fsdp_segfault_noise(path: Path) -> None:
    scan = scan_file(path, 210)
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 84
    assert scan.last_step == 210
    # SIGSEGV / "Fatal Python error" teardown noise is not a traceback or exception.
    assert kinds(scan, *FAILURE_KINDS) == []


def _gemma_cut_at_105(path: Path) -> None:
    scan = scan_file(path, 210)
    assert scan.terminal_event is None
    assert scan.last_step is None  # v0.1 lines carry no training/global_step
    assert scan.lines == 10  # final line has no newline and still counts
    assert [e.detail for e in scan.events if e.kind == "step_line"][-1] == "105"
    for expected in (210, 209):
        legacy = scan_file(path, expected, LEGACY_PATTERN)
        assert legacy.terminal_event is None
        assert legacy.last_step == 105


def _qwen05b_v01_complete(path: Path) -> None:
    assert scan_file(path, 434).terminal_event is None  # contract: global step required
    legacy = scan_file(path, 434, LEGACY_PATTERN)
    assert legacy.terminal_event is not None
    assert legacy.terminal_event.line == 4
    assert legacy.last_step == 434


def _pr1032_one_step_ansi(path: Path) -> None:
    scan = scan_file(path, 1)
    assert scan.lines == 314
    assert scan.terminal_event is None  # 3-dp era, no training/global_step key yet
    assert all("\x1b" not in e.text for e in scan.events)
    legacy = scan_file(path, 1, LEGACY_PATTERN)
    assert legacy.terminal_event is not None
    assert legacy.terminal_event.line == 313
    assert legacy.terminal_event.text.startswith("(TaskRunner pid=1244821) step:1 - ")
    assert kinds(legacy, *FAILURE_KINDS) == []


def _pr1100_cut_before_first_step(path: Path) -> None:
    scan = scan_file(path, 1)
    assert scan.lines == 370
    assert scan.terminal_event is None
    assert scan.last_step is None
    assert scan.events == ()
    assert scan_file(path, 1, LEGACY_PATTERN).last_step is None


def _pr1037_hydra(path: Path) -> None:
    scan = scan_file(path, 1)
    exception = "hydra.errors.MissingConfigException"
    assert kinds(scan) == [
        ("traceback", 12, ""),
        ("exception", 57, exception),
        ("traceback", 75, ""),
        ("exception", 120, exception),
    ]


def _quickstart_illustrative(path: Path) -> None:
    assert scan_file(path, 1).terminal_event is None
    assert scan_file(path, None, LEGACY_PATTERN).last_step == 1


def _deepseek_val_only_last(path: Path) -> None:
    for expected in (1119, 1120):
        assert scan_file(path, expected).terminal_event is None
    step_lines = [(e.line, e.detail) for e in scan_file(path, 1120).events]
    assert step_lines[-1] == (17, "1120")  # seen as a step line, never as a terminal
    assert len(step_lines) == STEP_LINES_KEPT


def _notes_cn_npfloat64(path: Path) -> None:
    scan = scan_file(path, 71)
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 1
    assert scan_file(path, 435).terminal_event is None
    assert scan_file(path, 435).last_step == 71
    assert scan_file(path, 7).terminal_event is None


def _issue2060_val_then_train(path: Path) -> None:
    scan = scan_file(path, 1)
    assert scan.terminal_event is not None
    assert (scan.terminal_event.line, scan.last_step) == (3, 1)
    assert scan_file(path, 0).terminal_event is None  # step:0 is validation only


def _nul_byte_named_actor(path: Path) -> None:
    scan = scan_file(path, 1)
    assert rules(scan) == [("AUD006", 7)]
    assert "\\x00" in scan.findings[0].citations[0].quote
    assert scan.terminal_event is None
    assert scan.events == ()  # NCCL INFO lines ("TIMEOUT(ms)") are not timeouts


def _torch_oom_compute_log_prob(path: Path) -> None:
    assert kinds(scan_file(path, 1)) == [
        ("exception", 13, "torch.OutOfMemoryError"),
        ("gpu_oom", 13, "torch.OutOfMemoryError"),
    ]


def _easyr1_runner_oom(path: Path) -> None:
    assert kinds(scan_file(path, 1)) == [
        ("exception", 7, "torch.OutOfMemoryError"),
        ("gpu_oom", 7, "torch.OutOfMemoryError"),
    ]


def _easyr1_raytaskerror(path: Path) -> None:
    assert kinds(scan_file(path, 1)) == [
        ("exception", 7, "ray.exceptions.RayTaskError(OutOfMemoryError)"),
        ("gpu_oom", 7, "RayTaskError(OutOfMemoryError)"),
    ]


def _init_oom_raylet(path: Path) -> None:
    # The raylet lists the OOM killer as one of three *possible* causes: not evidence.
    assert kinds(scan_file(path, 1), "gpu_oom", "host_oom") == []


def _ray_host_oom(path: Path) -> None:
    scan = scan_file(path, 1)
    assert kinds(scan, "host_oom", "gpu_oom") == [
        ("host_oom", 1, "ray.exceptions.OutOfMemoryError"),
        ("host_oom", 2, "exceeds the memory usage threshold"),
    ]
    assert kinds(scan, "exception") == [("exception", 1, "ray.exceptions.OutOfMemoryError")]


def _nccl_watchdog(path: Path) -> None:
    scan = scan_file(path, 1)
    nccl = kinds(scan, "nccl_timeout")
    assert nccl[0] == ("nccl_timeout", 1, "Watchdog caught collective operation timeout")
    assert [line for _, line, _ in nccl] == [1, 3, 4]
    assert kinds(scan, "gpu_oom", "host_oom") == []


def _vllm_cache_blocks(path: Path) -> None:
    # Line 2 is the quoted source of the raise inside a frame: code, not the failure.
    assert kinds(scan_file(path, 1)) == [
        ("exception", 3, "ValueError"),
        ("kv_cache_init_failure", 3, "ValueError"),
    ]


def _cumem_wake_up(path: Path) -> None:
    scan = scan_file(path, 1)
    assert kinds(scan, "exception") == [("exception", 5, "RuntimeError")]
    assert [line for _, line, _ in kinds(scan, "gpu_oom")] == [5, 6]
    assert kinds(scan, "host_oom") == []


def _slurm_time_limit(path: Path) -> None:
    assert kinds(scan_file(path, 1)) == [
        ("slurm_time_limit", 2, "494583"),
        ("slurm_time_limit", 3, "494583.0"),
    ]


def _slurm_step_cancelled(path: Path) -> None:
    # srun's "task 0: Killed" after the cancellation: the shell's report of a SIGKILL
    # (contract v1.2: a STEP line is one step ending, not the job's cancellation)
    assert kinds(scan_file(path, 1)) == [("slurm_step_cancelled", 4, "22051979.1"),
                                         ("signal", 5, "SIGKILL (the shell's report)")]


def _nothing_relevant(path: Path) -> None:
    scan = scan_file(path, 1)
    assert scan.terminal_event is None
    assert scan.events == ()
    assert scan.findings == ()


REAL_LOG_FACTS: dict[str, Callable[[Path], None]] = {
    "verldata__qwen2-7b-gpg-megatron-full-run-complete.log": _megatron_complete,
    "verldata__qwen2-7b-gpg-fsdp-tail-segfault-noise-complete.log": _fsdp_segfault_noise,
    "verl-data__gemma2b-ppo-tail-ends-step105-of-210.log": _gemma_cut_at_105,
    "verl-data__qwen05b-ppo-v01-main_task-tail-complete.log": _qwen05b_v01_complete,
    "verl-pr1032__ci-1step-complete-ansi.log": _pr1032_one_step_ansi,
    "verl-pr1100__fsdp-run-cut-before-first-step.log": _pr1100_cut_before_first_step,
    "verl-pr1037__hydra-missing-config-no-ray.log": _pr1037_hydra,
    "verl-docs__quickstart-expected-step-lines.log": _quickstart_illustrative,
    "verl-training-log__grpo-deepseek7b-v02-tail-val-only-last-step.log": _deepseek_val_only_last,
    "verl-notes-cn__taskrunner-step71-npfloat64-repr.log": _notes_cn_npfloat64,
    "verl-issue2060__step0-val-then-step1-train-3dp.log": _issue2060_val_then_train,
    "verl-data__qwen05b-ppo-named-actor-prefix-nul-byte.log": _nul_byte_named_actor,
    "verl-issue2828__torch-oom-compute-log-prob.log": _torch_oom_compute_log_prob,
    "easyr1-issue9__runner-torch-oom-private-pools.log": _easyr1_runner_oom,
    "easyr1-issue9__raytaskerror-oom-chain-update-actor.log": _easyr1_raytaskerror,
    "verl-issue217__init-oom-raylet-worker-died.log": _init_oom_raylet,
    "verl-issue2950__ray-host-oom-memory-monitor.log": _ray_host_oom,
    "verl-issue597__nccl-watchdog-timeout-slurm.log": _nccl_watchdog,
    "vllm-issue10439__v0-no-available-memory-cache-blocks.log": _vllm_cache_blocks,
    "lmm-r1-issue43__vllm-wake-up-cumem-oom-dedup.log": _cumem_wake_up,
    "zetta-utils-issue671__slurm-job-and-step-time-limit.log": _slurm_time_limit,
    "dagster-slurm-issue72__slurm-step-cancelled-ray-task-killed.log": _slurm_step_cancelled,
    "ray-issue31931__shutdown-drops-worker-line.log": _nothing_relevant,
    "ray-docs__log-dedup-example.log": _nothing_relevant,
}

needs_real_logs = pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="real evidence absent")


def _real_logs() -> list[str]:
    return sorted(p.name for p in REAL_LOGS.glob("*.log")) if REAL_LOGS.is_dir() else []


@needs_real_logs
def test_every_real_log_has_stated_facts() -> None:
    assert _real_logs() == sorted(REAL_LOG_FACTS)


@needs_real_logs
@pytest.mark.parametrize("name", _real_logs())
def test_real_log(name: str) -> None:
    REAL_LOG_FACTS[name](REAL_LOGS / name)


@needs_real_logs
def test_real_log_hashed_while_scanned() -> None:
    path = REAL_LOGS / "verldata__qwen2-7b-gpg-megatron-full-run-complete.log"
    with path.open("rb") as handle:
        reader = HashingReader(handle)
        scan = scan_training_log(reader, path.name, 105)
    assert scan.terminal_event is not None
    assert reader.digest().sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------- defect fixtures


def defect(
    name: str, expected_steps: int | None = 1, pattern: str | None = None
) -> TrainingLogScan:
    return scan_bytes((DEFECTS / name).read_bytes(), expected_steps, pattern)


def test_terminal_np_int64() -> None:
    scan = defect("terminal_np_int64.log")
    assert scan.terminal_event is not None
    assert (scan.terminal_event.line, scan.terminal_event.detail) == (2, "1")
    assert scan.terminal_event.kind == "terminal_event"


@pytest.mark.parametrize("value", ["1", "1.000", "1.0", "np.int64(1)", "np.float64(1.0)"])
def test_terminal_value_forms(value: str) -> None:
    line = f"step:{value} - actor/pg_loss:0.1 - training/global_step:{value}\n".encode()
    scan = scan_bytes(line, 1)
    assert scan.terminal_event is not None
    assert scan.last_step == 1


@pytest.mark.parametrize("value", ["1.5", "1e0", "11", "0", "one"])
def test_terminal_value_not_one(value: str) -> None:
    scan = scan_bytes(f"step:{value} - training/global_step:{value}\n".encode(), 1)
    assert scan.terminal_event is None


@pytest.mark.parametrize("digit", ["\uff11", "\u0661", "\u09e7", "\U0001d7cf"])
@pytest.mark.parametrize("pattern", [None, r"^step:(?P<step>\d+) - "])
def test_a_step_in_other_digits_is_no_terminal_event(digit: str, pattern: str | None) -> None:
    """``step:N`` is written in ASCII digits: a full-width, Arabic-Indic, Bengali or
    mathematical digit one (which ``int()`` reads as 1) is no terminal event, by the default
    matcher or a protocol's pattern whose ``\\d`` takes it."""
    line = f"step:{digit} - actor/pg_loss:0.1 - training/global_step:{digit}\n".encode()
    assert scan_bytes(line, 1, pattern).terminal_event is None
    assert scan_bytes(line.replace(digit.encode(), b"1"), 1, pattern).terminal_event is not None


def test_terminal_float_form() -> None:
    scan = defect("terminal_float_form.log")
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 2
    assert scan.last_step == 1


def test_step_key_boundaries() -> None:
    assert defect("step_key_boundaries.log", 1).terminal_event is None  # timing_s/step:1.000
    scan = defect("step_key_boundaries.log", 10)
    assert scan.terminal_event is not None
    assert scan.last_step == 10


def test_global_step_must_follow_and_agree() -> None:
    assert scan_bytes(b"training/global_step:1 - step:1 - x:1\n", 1).terminal_event is None
    assert scan_bytes(b"step:1 - training/global_step:2\n", 1).terminal_event is None
    assert scan_bytes(b"step:1 - global_step:1\n", 1).terminal_event is None
    # two records glued on one line: each step key pairs with its own global step
    glued = b"step:2 - training/global_step:2 - step:1 - x:0\n"
    assert scan_bytes(glued, 1).terminal_event is None


def test_val_only_step_after_last() -> None:
    scan = defect("val_only_step_after_last.log", 2)
    assert scan.terminal_event is None
    assert scan.last_step == 1
    assert defect("val_only_step_after_last.log", 1).terminal_event is not None


def test_first_terminal_line_wins() -> None:
    data = b"step:1 - training/global_step:1 - a:1\nstep:1 - training/global_step:1 - a:2\n"
    scan = scan_bytes(data, 1)
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 1


def test_expected_steps_none_still_records_last_step() -> None:
    scan = defect("val_only_step_after_last.log", None)
    assert scan.terminal_event is None
    assert scan.expected_steps is None
    assert scan.last_step == 1


def test_ansi_and_ray_prefix() -> None:
    scan = defect("ansi_and_ray_prefix.log")
    assert scan.terminal_event is not None  # "\x1b[32mstep:1" is the step key once stripped
    assert scan.terminal_event.text.startswith("(TaskRunner pid=3657400) step:1 - ")
    # the traceback's exception line is found through the interleaved lines of other
    # processes; the quoted `raise torch.OutOfMemoryError(...)` source is not an OOM
    assert kinds(scan, *FAILURE_KINDS) == [
        ("traceback", 2, ""),
        ("exception", 7, "torch.OutOfMemoryError"),
        ("gpu_oom", 7, "torch.OutOfMemoryError"),
        ("traceback", 8, ""),
        ("exception", 12, "AssertionError"),  # bare: found only by following pid=3657526
    ]
    assert all("\x1b" not in e.text for e in scan.events)


def test_carriage_return_progress() -> None:
    scan = defect("carriage_return_progress.log", 1, pattern=r"^step:(?P<step>\d+) - ")
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 1  # the physical line
    assert scan.terminal_event.text.startswith("step:1 - ")
    assert kinds(scan, "exception", "gpu_oom") == [
        ("exception", 2, "torch.OutOfMemoryError"),
        ("gpu_oom", 2, "torch.OutOfMemoryError"),
    ]
    assert scan.lines == 2


def test_invalid_utf8() -> None:
    scan = defect("invalid_utf8.log")
    assert rules(scan) == [("AUD005", 2)]
    assert "\ufffd" in scan.findings[0].citations[0].quote
    assert scan.terminal_event is not None  # later lines still scanned
    assert scan.terminal_event.line == 3


def test_clipped_multibyte_is_not_invalid_utf8() -> None:
    line = "é".encode() * 40_000 + b"\n"  # 80,000 bytes, cut inside a character
    scan = scan_bytes(line, None, max_line=65_535)
    assert rules(scan) == [("AUD007", 1)]
    assert "80000 bytes clipped to 65535" in scan.findings[0].message


def test_nul_bytes() -> None:
    scan = defect("nul_bytes.log")
    assert rules(scan) == [("AUD006", 1), ("AUD017", 3)]  # once per file, at its first line
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 2
    assert "\x00" not in scan.terminal_event.text
    assert scan.lines == 3


def test_no_trailing_newline() -> None:
    """A log cut mid-line still yields what its last line holds, and says it was cut."""
    scan = defect("no_trailing_newline.log")
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 2
    assert [(f.rule_id, f.citations[0].line) for f in scan.findings] == [("AUD017", 2)]


def test_host_oom_vs_gpu_oom() -> None:
    scan = defect("host_oom_vs_gpu_oom.log")
    assert kinds(scan, "host_oom", "gpu_oom") == [
        ("host_oom", 1, "ray.exceptions.OutOfMemoryError"),
        ("host_oom", 2, "exceeds the memory usage threshold"),
        ("host_oom", 3, "oom_kill"),
        ("host_oom", 4, "Out of memory: Killed process"),
        ("gpu_oom", 5, "torch.OutOfMemoryError"),
        ("gpu_oom", 6, "CUDA error: out of memory"),
        ("gpu_oom", 7, "torch.cuda.OutOfMemoryError"),
    ]


def test_coordinated_shutdown() -> None:
    scan = defect("coordinated_shutdown.log")
    assert [line for _, line, _ in kinds(scan, "coordinated_shutdown")] == [2, 3, 5]


def test_slurm_job_cancelled() -> None:
    assert kinds(defect("slurm_job_cancelled.log")) == [
        ("slurm_cancelled", 1, "5055845"),
        ("slurm_time_limit", 2, "5055845.0"),
        ("signal", 3, "SIGKILL (the shell's report)"),  # srun's "task 0: Killed"
    ]


def test_kv_cache_v1() -> None:
    scan = defect("kv_cache_v1.log")
    assert kinds(scan, "kv_cache_init_failure") == [("kv_cache_init_failure", 2, "ValueError")]


def test_bad_pattern_is_refused_before_reading() -> None:
    stream = io.BytesIO(b"step:1 - training/global_step:1\n")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        scan_training_log(stream, "training-1.log", 1, pattern=r"step:(?P<step>\d+")
    with pytest.raises(ValueError, match="no named group 'step'"):
        scan_training_log(stream, "training-1.log", 1, pattern=r"step:(\d+)")
    assert stream.tell() == 0


def test_pattern_accepts_value_forms() -> None:
    data = b"it=np.int64(3) done\n"
    scan = scan_bytes(data, 3, pattern=r"it=(?P<step>\S+) done")
    assert scan.terminal_event is not None
    assert scan.last_step == 3


def test_events_capped_terminal_kept() -> None:
    data = b"Traceback (most recent call last):\n" * 50 + b"step:1 - training/global_step:1\n"
    scan = scan_bytes(data, 1, max_events=5)
    assert len(kinds(scan, "traceback")) == 5
    assert scan.events_dropped == 45
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 51


def test_events_capped_every_kind_kept() -> None:
    traceback = b"Traceback (most recent call last):\n"
    data = (
        traceback * 100
        + b"torch.OutOfMemoryError: CUDA out of memory.\n"  # line 101
        + traceback * 100
        + b"slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***\n"  # 202
        + traceback * 3
    )
    scan = scan_bytes(data, None, max_events=8)
    assert len(scan.events) == 8
    assert scan.events_dropped == 207 - 8  # 205 lines, line 101 holds two events
    lines = [line for _, line, _ in kinds(scan)]
    assert lines == sorted(lines)
    assert ("gpu_oom", 101, "torch.OutOfMemoryError") in kinds(scan)
    assert ("exception", 101, "torch.OutOfMemoryError") in kinds(scan)
    assert ("slurm_cancelled", 202, "7") in kinds(scan)
    assert lines[:3] == [1, 2, 3]  # the head
    assert lines[-1] == 205  # the tail


def test_event_text_clipped() -> None:
    data = b"torch.OutOfMemoryError: CUDA out of memory. " + b"x" * 5000 + b"\n"
    scan = scan_bytes(data, None)
    assert all(len(e.text) <= 300 for e in scan.events)


# ------------------------------------------------------------ generated inputs


def _write(path: Path, parts: list[bytes]) -> Path:
    with path.open("wb") as handle:
        for part in parts:
            handle.write(part)
    return path


def test_100mb_single_line_bounded(tmp_path: Path) -> None:
    size = 100 * 2**20
    path = tmp_path / "training-1.log"
    with path.open("wb") as handle:
        handle.write(b"step:1 - training/global_step:1 - ")
        block = b"x" * 2**20
        for _ in range(100):
            handle.write(block)
        handle.write(b"\nstep:1 - training/global_step:1 - second\n")
    tracemalloc.start()
    try:
        scan = scan_file(path, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20
    assert scan.lines == 2
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 1  # found in the examined start of the line
    assert rules(scan) == [("AUD007", 1)]
    assert f"line of {size + 34} bytes clipped to 65536" in scan.findings[0].message


def test_200k_lines_terminal_at_end(tmp_path: Path) -> None:
    chatter = b"\x1b[36m(WorkerDict pid=3657525, ip=10.0.0.7)\x1b[0m rollout chatter 0123456789\n"
    steps = [f"(TaskRunner pid=1) step:{n} - training/global_step:{n}\n".encode() for n in (1, 2)]
    path = _write(tmp_path / "training-1.log", [chatter * 100_000, steps[0], chatter * 100_000])
    with path.open("ab") as handle:
        handle.write(steps[1])
    scan = scan_file(path, 2)
    assert scan.lines == 200_002
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 200_002
    assert scan.last_step == 2


def test_generated_invalid_utf8_nul_no_newline(tmp_path: Path) -> None:
    lines = [b"chatter\n"] * 1000
    lines[10] = b"bad \xff byte\n"
    lines[20] = b"nul \x00 byte\n"
    lines[30] = b"nul again \x00\n"
    lines.append(b"step:5 - training/global_step:5")  # no trailing newline
    scan = scan_file(_write(tmp_path / "training-1.log", lines), 5)
    assert rules(scan) == [("AUD005", 11), ("AUD006", 21), ("AUD017", 1001)]
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 1001


def test_generated_carriage_return_progress(tmp_path: Path) -> None:
    bar = b"".join(f"\rTraining Progress: {n}%".encode() for n in range(0, 101))
    lines = [b"(TaskRunner pid=1) " + bar + b"\n"] * 500
    lines.append(b"(TaskRunner pid=1) " + bar + b"\rstep:3 - training/global_step:3\n")
    scan = scan_file(_write(tmp_path / "training-1.log", lines), 3)
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 501
    assert scan.terminal_event.text == "step:3 - training/global_step:3"


# ------------------------------------------------- chunked reading vs line by line
#
# The scanner reads chunks and examines only the lines its word search finds; the
# reference below is the plain loop it replaces (every line split off in memory, the
# trigger regex on each). Both feed the same _Scanner, so they must agree exactly,
# whatever the chunk size, line limit and search tuning.


def reference_scan(
    data: bytes,
    expected_steps: int | None,
    pattern: str | None = None,
    max_events: int = 200,
    max_line: int = 65536,
) -> TrainingLogScan:
    path = "training-1.log"
    custom = matcher(TerminalSpec(patterns=(pattern,))) if pattern is not None else None
    scanner = log_events._Scanner(path, expected_steps, custom, max_events)
    utf8: tuple[int, str] | None = None
    nul: tuple[int, str] | None = None
    clipped: tuple[int, int] | None = None
    lines = 0
    for line in plain_lines(data, max_line):
        lines = line.number
        if utf8 is None and not line.data.isascii():
            bad = training_log._utf8_error_offset(line.data, line.clipped)
            if bad is not None:
                utf8 = (lines, log_events._quote(line.data, bad))
        if clipped is None and line.clipped:
            clipped = (lines, line.length)
        if custom or scanner.open_tracebacks or training_log._TRIGGER.search(line.data):
            if nul is None and b"\x00" in line.data:
                nul = (lines, log_events._quote(line.data, line.data.index(b"\x00")))
            scanner.examine(lines, line.data)
    findings = []
    if utf8 is not None:
        findings.append(table.finding("AUD005", path, [Citation(path, utf8[0], quote=utf8[1])]))
    if nul is not None:
        findings.append(table.finding("AUD006", path, [Citation(path, nul[0], quote=nul[1])]))
    if clipped is not None:
        findings.append(
            table.finding(
                "AUD007", path, [Citation(path, clipped[0])], length=clipped[1], limit=max_line
            )
        )
    if data and not data.endswith(b"\n"):
        findings.append(table.finding("AUD017", path, [Citation(path, lines)], line=lines))
    findings.sort(key=lambda found: (found.citations[0].line or 0, found.rule_id))
    return scanner.result(lines, tuple(findings))


FRAGMENTS = [
    b"step:1", b"step: 2", b" - training/global_step:1", b" - training/global_step:2.000",
    b"step:np.int64(3) - training/global_step:np.float64(3.0)", b"timing_s/step:1.0",
    b"global_step:1", b"rror", b"Error: boom", b"ValueError: bad value", b"xception",
    b"RuntimeError: CUDA error: out of memory", b"Exception: why", b"emory", b"oom",
    b"oom-kill", b"NCCL", b"NCCL version 2.21.5", b"ProcessGroupNCCL Timeout(ms)=600",
    b"ProcessGroupNCCL Timeout", b"Watchdog caught collective operation timeout",
    b"watchdog got stuck", b"heartbeat monitor timed out", b"KV cache", b"not enough",
    b"cache", b"CANCELLED", b"E", b"H", b'"', b"x", b"EE", b"HU",
    b"slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***",
    b"*** STEP 5.0 CANCELLED AT 2024 ***", b"hut", b"HUT", b"sHuT down", b"shut down",
    b"coordinated shutdown", b"no policy replicas", b"olicy",
    b"COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS",
    b"Traceback (most recent call last):", b"Traceback", b'  File "x.py", line 1, in <module>',
    b'File "', b"    raise X(y)", b"    ^^^^", b"\x00", b"\x1b[36m", b"\x1b[0m", b"\x1b]0;t\x07",
    b"(TaskRunner pid=1) ", b"(WorkerDict pid=2, ip=10.0.0.1) ", b"[rank0]: ", b"svc  | ",
    b"INFO 01-02 03:04:05 [x.py:1] ", b"\r", b"\r\n", b"\xff", b"\xe2\x96\x88", b"\xe2\x96",
    b"torch.OutOfMemoryError: CUDA out of memory.", b"No available memory for the cache blocks",
    b"chatter ", b"y" * 40, b"  ", b"\t", b"ste\x1b[0mp:1", b"em\x1b[1mory", b"Trace\x1b[0mback",
    b"NCCL\x1b[0m", b"\x1b[32mNCCL",
]  # fmt: skip


def random_log(rng: random.Random) -> bytes:
    lines = []
    for _ in range(rng.choice([1, 3, 30, 200])):
        count = rng.choice([0, 1, 1, 2, 3, 6])
        lines.append(b"".join(rng.choice(FRAGMENTS) for _ in range(count)))
    data = rng.choice([b"\n", b"\n", b"\r\n"]).join(lines)
    return data + b"\n" if rng.random() < 0.5 else data


@pytest.mark.parametrize("seed", range(12))
def test_chunked_agrees_with_line_by_line(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        data = random_log(rng)
        monkeypatch.setattr(_io, "CHUNK_SIZE", rng.choice([1 << 20, 1, 2, 5, 64, 777]))
        monkeypatch.setattr(training_log, "HIT_BLOCK", rng.choice([1 << 18, 1, 10, 100]))
        monkeypatch.setattr(training_log, "UTF8_PIECE", rng.choice([1 << 14, 1, 30]))
        monkeypatch.setattr(training_log, "NUMPY_COUNT", rng.choice([1 << 15, 0, 1, 9]))
        args = (
            rng.choice([None, 1, 2, 3]),
            rng.choice([None, None, None, r"step:(?P<step>\S+)"]),
            rng.choice([200, 200, 0, 1, 5]),
            rng.choice([65536, 65536, 1, 4, 20, 100]),
        )
        assert scan_bytes(data, *args) == reference_scan(data, *args), (data, args)


@needs_real_logs
@pytest.mark.parametrize("chunk_size", [1, 7, 4096])
def test_real_logs_any_chunk_size(chunk_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_io, "CHUNK_SIZE", chunk_size)
    for name in _real_logs():
        data = (REAL_LOGS / name).read_bytes()
        for expected, pattern, max_line in ((105, None, 65536), (1, LEGACY_PATTERN, 80)):
            assert scan_bytes(data, expected, pattern, max_line=max_line) == reference_scan(
                data, expected, pattern, max_line=max_line
            ), name


def test_one_search_covers_the_trigger_words() -> None:
    """Every trigger word the reference regex knows is found by the one-pass search
    (NUL by memchr), wherever it stands on its line, and each hit gives its own line."""
    for word in training_log._TRIGGER_WORDS:
        for data in (word + b"\n", b"x" + word + b"y\n", b"a\n" + word + word + b"\nb\n"):
            expected = [data.count(b"\n", 0, m.start()) + 1
                        for m in re.finditer(re.escape(word), data)]
            if word == b"NCCL":  # skipped when nothing else on the line can matter
                expected = []
            assert _hits(data) == sorted(set(expected)), (word, data)


def _hits(data: bytes) -> list[int]:
    """Numbers (1-based) of the lines of ``data`` the word search picks."""
    starts = training_log._hit_lines(data, 0, len(data))
    return [data.count(b"\n", 0, start) + 1 for start in starts]


def test_nccl_only_lines_skipped_when_they_cannot_matter() -> None:
    data = (
        b"(WorkerDict pid=2) NCCL version 2.21.5+cuda12.4\n"  # 1: nothing to find
        b"NCCL INFO Channel 00/02 : 0 1\n"  # 2
        b"[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout\n"
        b"\x1b[36m(WorkerDict pid=2)\x1b[0m NCCL INFO ring\n"  # 4: ESC may hide a word
        b"NCCL version 2.21.5 - Error\n"  # 5: another trigger word
        b"NCCL: KV cache not enough\n"  # 6: KV text without Error/memory
        b"NCCL: coordinated sHuTdown, no policy replicas\n"  # 7: shutdown gated on "olicy"
        b"chatter\n"
    )
    assert _hits(data) == [3, 4, 5, 6, 7]
    assert _hits(b"NCCL version 2.21.5\n\x1b[36m(WorkerDict pid=2)\x1b[0m NCCL INFO\n") == [2]
    scan = scan_bytes(data, None)
    assert scan == reference_scan(data, None)
    assert kinds(scan, "nccl_timeout", "kv_cache_init_failure", "coordinated_shutdown") == [
        ("nccl_timeout", 3, "Watchdog caught collective operation timeout"),
        ("kv_cache_init_failure", 6, ""),
        ("coordinated_shutdown", 7, ""),
    ]


def test_every_text_that_makes_an_nccl_line_matter_is_searched() -> None:
    """A line whose only trigger word is "NCCL" is examined when it holds any text that
    can give it an event: each KV-cache trouble word (but "Error", itself a trigger), each
    NCCL timeout text, the shutdown one; the scan then agrees with the reference, which
    examines every line holding a trigger word."""
    texts = [b"KV cache " + word.encode() for word in failure_texts._KV_CACHE_TROUBLE
             if word != "Error"]
    texts += [b"NCCL " + text.encode() for text in failure_texts._NCCL_TIMEOUT]
    texts += [b"ProcessGroupNCCL Timeout", b"sHuTdown: no policy replicas"]
    for text in texts:
        data = b"chatter\n(WorkerDict pid=2) NCCL: " + text + b"\nchatter\n"
        assert _hits(data) == [2], text
        scan = scan_bytes(data, None)
        assert scan == reference_scan(data, None)
        assert scan.events, text


def test_words_on_long_lines_and_overlapping_words_are_found() -> None:
    metrics = b"step:1 - " + b"actor/entropy:0.1 - " * 100 + b"training/global_step:1\n"
    data = metrics + b"boom Error: x\n" + metrics + b"Traceback (most recent call last):\n"
    assert _hits(data) == [1, 2, 3, 4]
    # "NCCL" beside another word must not hide it (nor the line be skipped)
    assert _hits(b"xNCCLoom\nNCCLANCELLED\nNCCANCELLED\nchatter\n") == [1, 3]
    assert _hits(b"a\x00b\nc\nd\x00\x00\n\x00") == [1, 3, 4]
    # what makes an NCCL line matter must be on that line, not the next or the last
    assert _hits(b"KV cache\nNCCL version\n\x1b[0m\nNCCL INFO\nolicy\n") == []
    assert _hits(b"NCCL \x1b[0m\n\x1b[0m\n" * 3) == [1, 3, 5]


def test_filler_lines_are_not_examined(monkeypatch: pytest.MonkeyPatch) -> None:
    examined: list[int] = []
    original = log_events._Scanner.examine

    def counting(self: log_events._Scanner, number: int, data: bytes) -> None:
        examined.append(number)
        original(self, number, data)

    monkeypatch.setattr(log_events._Scanner, "examine", counting)
    filler = [
        b"(WorkerDict pid=3, ip=10.0.0.3) INFO 09-15 18:10:40 [kv_cache_utils.py:716] GPU KV "
        b"cache size: 1109404 tokens\n",
        b"(WorkerDict pid=3, ip=10.0.0.3) NCCL version 2.21.5+cuda12.4\n",
        b"(TaskRunner pid=1) dataloader worker 30: prefetched batch 097 of 234\n",
    ]
    data = b"".join(filler) * 20_000 + b"(TaskRunner pid=1) step:1 - training/global_step:1\n"
    scan = scan_bytes(data, 1)
    assert examined == [60_001]
    assert scan.terminal_event is not None
    assert scan.lines == 60_001


def test_chunk_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_io, "CHUNK_SIZE", 16)
    data = (
        b"chatter chatter\r\n"  # 17 bytes: the \n starts the second chunk
        b"Traceback (most recent call last):\r\n"  # a traceback open across chunks
        b'  File "x.py", line 1, in <module>\r\n'
        b"(TaskRunner pid=1) unrelated\r\n"
        b"ValueError: bad\r\n"
        + b"z" * 40
        + b" step:1 - training/global_step:1\r\n"  # long line, clipped at 40 bytes
        + b"bad \xff byte, NUL \x00 byte\r\n"
        + b"step:2 - training/global_step:2\r"  # final line without \n keeps its \r
    )
    scan = scan_bytes(data, 2, max_line=40)
    assert scan == reference_scan(data, 2, max_line=40)
    assert kinds(scan, "traceback", "exception") == [
        ("traceback", 2, ""),
        ("exception", 5, "ValueError"),
    ]
    assert rules(scan) == [("AUD007", 6), ("AUD005", 7), ("AUD006", 7), ("AUD017", 8)]
    assert scan.terminal_event is not None
    assert scan.terminal_event.line == 8
    assert scan.lines == 8


def test_invalid_utf8_found_in_a_late_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    data = "é chatter\n".encode() * 5000 + b"bad \xc3( byte\n" + b"chatter\n" * 10
    scan = scan_bytes(data, None)
    assert rules(scan) == [("AUD005", 5001)]
    assert scan == reference_scan(data, None)
    monkeypatch.setattr(training_log, "UTF8_PIECE", 7)
    assert scan_bytes(data, None) == scan


def test_step_key_boundary_characters() -> None:
    for before, is_key in (("é", False), ("٣", False), ("_", False), ("(", True), ("=", True)):
        line = f"{before}step:1 - training/global_step:1\n".encode()
        assert (scan_bytes(line, 1).terminal_event is not None) is is_key, before
        assert scan_bytes(line, 1) == reference_scan(line, 1)


def test_final_line_keeps_its_carriage_return() -> None:
    data = b"chatter\r\nNUL \x00 in a final line\r"  # iter_lines strips \r only before \n
    scan = scan_bytes(data, None)
    assert scan == reference_scan(data, None)
    assert scan.findings[0].citations[0].quote == "NUL \\x00 in a final line\\x0d"


def test_dense_hits_bounded(tmp_path: Path) -> None:
    # Every line a hit: the line starts found are kept per block of HIT_BLOCK bytes.
    # In one block, this chunk's 140k line starts, texts and positions take 40 MB.
    path = _write(tmp_path / "training-1.log", [b"NCCL x\n" * 140_000])  # 1 MB
    tracemalloc.start()
    try:
        scan = scan_file(path, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scan.lines == 140_000
    assert peak < 20 * 2**20


@pytest.mark.parametrize(("line", "fault"), [
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
     "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", True),
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, remote process exited or there "
     "was a network error, NCCL version 2.18.1", True),
    ("ncclRemoteError: A call failed possibly due to a network error or a remote process "
     "exiting prematurely.", True),
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage (run with "
     "NCCL_DEBUG=WARN for details)", False),
    ("DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL "
     "version 2.19.3 ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda "
     "failure 'out of memory'", False),
    ("NCCL_ERROR_HANDLING=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1", False),
])
def test_an_nccl_communication_failure_is_told_from_the_code_s_and_the_gpu_s(
        line: str, fault: bool) -> None:
    scan = scan_training_log(io.BytesIO(f"(TaskRunner pid=1) {line}\n".encode()), "t.log", 1)
    assert any(event.kind == "nccl_error" for event in scan.events) is fault


@pytest.mark.parametrize(("gap", "kept"), [(10, True), (999, True), (1000, False)])
def test_a_traceback_is_forgotten_past_its_horizon(gap: int, kept: bool) -> None:
    """Its exception line is read as the traceback's within TRACEBACK_HORIZON lines of its
    last frame (an exception named anything), not after (nothing then names it one)."""
    lines = [b"(A pid=1) Traceback (most recent call last):",
             b'(A pid=1)   File "x.py", line 1, in <module>',
             *(b"(B pid=2) filler %d" % index for index in range(gap)),
             b"(A pid=1) KeyboardInterrupt"]
    scan = scan_training_log(io.BytesIO(b"\n".join(lines) + b"\n"), "t.log", None)
    exceptions = [(event.line, event.detail) for event in scan.events
                  if event.kind == "exception"]
    assert exceptions == ([(len(lines), "KeyboardInterrupt")] if kept else [])
    assert log_events.TRACEBACK_HORIZON == 1000


def test_a_terminal_line_quoted_in_a_message_about_it_is_not_the_event() -> None:
    """The launcher's own complaint quotes the pattern it missed, in single quotes (Python's
    repr) or backticks: no step line (a period resolved on it). A JSON forwarder's
    double-quoted line is the run's own, and counts."""
    quoted = (b"[launcher] status: infrastructure_invalid (ValueError: Successful exit lacks "
              b"the terminal event 'step:1 - training/global_step:1')\n"
              b"note: expected `step:1 - training/global_step:1` in the log\n")
    assert scan_bytes(quoted, 1).terminal_event is None
    forwarded = b'{"level": "info", "msg": "step:1 - training/global_step:1 - loss:0.2"}\n'
    found = scan_bytes(forwarded, 1).terminal_event
    assert found is not None and found.line == 1


# ---------------------------------------------------------------- logs dense with failures


def _dense_log(rounds: int, port: Callable[[int], int] = lambda i: 8000 + i % 9) -> bytes:
    """``rounds`` rounds of what a failing run repeats (a watchdog's timeout, a CUDA OOM retry,
    a memory FutureWarning, a retry loop's traceback), numbers varying, then Slurm's line."""
    lines: list[str] = []
    for i in range(rounds):
        rank, seq = i % 8, 1000 + i
        lines += [
            f"[rank{rank}]:[E1207 10:{i % 60:02d}:{i % 60:02d}.{i:06d} {4000 + i} "
            f"ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={i}, NumelOut={i}, "
            f"Timeout(ms)=600000) ran for {600000 + i} milliseconds before timing out.",
            f"(WorkerDict pid={100 + rank}) CUDA out of memory. Tried to allocate {i % 40}.00 GiB."
            f" GPU {rank} has a total capacity of 79.15 GiB. Retrying with micro batch {i % 16}",
            f"(WorkerDict pid={100 + rank}) /usr/lib/python3/torch/cuda/memory.py:391: "
            "FutureWarning: torch.cuda.reset_max_memory_allocated now calls "
            "torch.cuda.reset_peak_memory_stats, which resets /all/ peak memory stats.",
            f"(WorkerDict pid={100 + rank}) Traceback (most recent call last):",
            f'(WorkerDict pid={100 + rank})   File "/opt/retry.py", line {i % 90 + 1}, in call',
            f"(WorkerDict pid={100 + rank})     return fn()",
            f"(WorkerDict pid={100 + rank}) requests.exceptions.ConnectionError: "
            f"HTTPSConnectionPool(host='10.0.0.{rank}', port={port(i)}): Max retries "
            "exceeded with url: /v1/push (Caused by NewConnectionError('Failed to establish a "
            "new connection: [Errno 111] Connection refused'))",
        ]
    lines.append("slurmstepd: error: *** JOB 4242 ON node001 CANCELLED AT "
                  "2026-01-01T00:00:00 DUE TO TIME LIMIT ***")
    return ("\n".join(lines) + "\n").encode()


def test_a_log_dense_with_failures_shows_what_it_always_showed() -> None:
    """7,000 lines that all pass the prefilter, their failure texts repeated with varying
    numbers: the same events, texts, details, caps and drop count as before the examination
    was made faster (remembered texts, a gate, fewer pattern searches), read twice (the second
    time from what was remembered), and Slurm's time-limit line after them still found."""
    for _ in range(2):
        scan = scan_training_log(io.BytesIO(_dense_log(1000)), "t.log", 3)
        assert (scan.lines, scan.events_dropped, len(scan.events)) == (7001, 4801, 200)
        assert scan.terminal_event is None and scan.findings == ()
        firsts: dict[str, tuple[int, str]] = {}
        for event in scan.events:
            firsts.setdefault(event.kind, (event.line, event.detail))
        assert firsts == {
            "nccl_timeout": (1, "Watchdog caught collective operation timeout"),
            "gpu_oom": (2, "CUDA out of memory"), "traceback": (4, ""),
            "exception": (7, "requests.exceptions.ConnectionError"),
            "network": (7, "Max retries exceeded with url"), "slurm_time_limit": (7001, "4242")}
        assert [(e.kind, e.line) for e in scan.events[148:152]] == [
            ("exception", 210), ("network", 210), ("gpu_oom", 6932), ("traceback", 6934)]
        assert scan.events[-1].text == (
            "slurmstepd: error: *** JOB 4242 ON node001 CANCELLED AT 2026-01-01T00:00:00 DUE "
            "TO TIME LIMIT ***")
        digest = hashlib.sha256(repr([(e.kind, e.line, e.text, e.detail)
                                      for e in scan.events]).encode()).hexdigest()
        assert digest == "255bbeb323310ee5428ec823d7893c5b00b90814fb2b22d74b68ab83c2bc7a7d"


class _Counted:
    """A pattern that counts its searches (by kind)."""

    def __init__(self, kind: str, pattern: re.Pattern[str], counts: dict[str, int]) -> None:
        self.kind, self.pattern, self.counts = kind, pattern, counts

    def search(self, text: str) -> re.Match[str] | None:
        self.counts[self.kind] = self.counts.get(self.kind, 0) + 1
        return self.pattern.search(text)


def test_a_dense_log_searches_a_repeated_failure_text_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry loop's exception line, repeated 500 times in 8 texts: the contract v1.2 cause
    patterns search each text once in the whole log, not once a line; and
    a line holding only the storage and network kinds' words is searched by those two
    patterns alone, never by the five others (whose dozens of alternatives search slowly)."""
    counts: dict[str, int] = {}
    monkeypatch.setattr(failure_texts, "_MORE_CAUSES", tuple(
        (kind, _Counted(kind, pattern, counts)) for kind, pattern in failure_texts._MORE_CAUSES))
    scan = scan_training_log(io.BytesIO(_dense_log(500, port=lambda i: 1)), "t.log", 3)
    assert scan.events_dropped == 2301  # (500 rounds of 5 events, and Slurm's, less 200)
    # (its 8 texts, a host a rank: once each; and round 429's watchdog line, holding "429")
    assert counts == {"storage": 8, "network": 9}
    counts.clear()
    scan = scan_training_log(io.BytesIO(_dense_log(500, port=lambda i: 20000 + i)), "t.log", 3)
    assert kinds(scan, "network")[-1] == ("network", 3500, "Max retries exceeded with url")
    # ("Errno" and "Max retries" held; and the watchdog line again)
    assert counts == {"storage": 500, "network": 501}


def _expansions(items: list[tuple[object, object]]) -> list[set[str]]:
    """The literal runs of a parsed regex sequence: for each run, every text it may be (a run
    goes on through a group or an alternation of literals; anything else ends it)."""
    from re import _constants as c  # type: ignore[attr-defined]  # (sre internals, 3.11)

    runs: list[set[str]] = []
    current: set[str] = {""}
    for op, value in items:
        options: set[str] | None = None
        if op is c.LITERAL:
            options = {chr(value)}  # type: ignore[arg-type]
        elif op is c.SUBPATTERN:
            inner = value[-1]  # type: ignore[index]
            found = _expansions(list(inner))
            options = found[0] if len(found) == 1 and _whole(list(inner)) else None
        elif op is c.BRANCH:
            texts: set[str] = set()
            for branch in value[1]:  # type: ignore[index]
                found = _expansions(list(branch))
                if len(found) != 1 or not _whole(list(branch)):
                    texts = set()
                    break
                texts |= found[0]
            options = texts or None
        if options is None:
            runs.append(current)
            current = {""}
        else:
            current = {head + tail for head in current for tail in options}
    runs.append(current)
    return [run for run in runs if run != {""}] or [{""}]


def _whole(items: list[tuple[object, object]]) -> bool:
    """Whether a parsed sequence is literals only (through groups and alternations)."""
    from re import _constants as c  # type: ignore[attr-defined]

    for op, value in items:
        if op is c.SUBPATTERN:
            if not _whole(list(value[-1])):  # type: ignore[index]
                return False
        elif op is c.BRANCH:
            if not all(_whole(list(b)) for b in value[1]):  # type: ignore[index]
                return False
        elif op is not c.LITERAL:
            return False
    return True


def test_each_cause_pattern_alternative_holds_one_of_its_kinds_words() -> None:
    """A kind's pattern is searched only on a line holding one of its words
    (``failure_texts._MORE_WORDS``): every top-level alternative of the pattern has a run of
    literal text that, however its inner alternations go, holds one of them."""
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    from auditor.collect import failure_texts

    assert [kind for kind, _ in failure_texts._MORE_CAUSES] == list(failure_texts._MORE_WORDS)
    for kind, pattern in failure_texts._MORE_CAUSES:
        words = failure_texts._MORE_WORDS[kind]
        parsed = list(_parser.parse(pattern.pattern))
        branches = parsed[0][1][1] if len(parsed) == 1 and parsed[0][0] is c.BRANCH \
            else [parsed]
        for branch in branches:
            runs = _expansions(list(branch))
            assert any(all(any(word in text for word in words) for text in run)
                       for run in runs), (kind, branch)


def test_the_failure_gate_holds_the_first_word_of_every_test() -> None:
    """Every ``"word" in content`` (or ``text``) test of ``failure_events`` and ``_ends``
    names a word that holds one of ``FAILURE_GATE_WORDS`` (a line holding none is not
    examined), or is a test inside one that does (listed here)."""
    import ast
    import inspect

    inner = {"Timeout", "death signal", "SignalException", "raise ChildFailedError",
             failure_texts.CONTROLLER_ENDED}
    gate = failure_texts.FAILURE_GATE_WORDS
    for function in (failure_texts.failure_events, failure_texts._ends):
        tree = ast.parse(inspect.getsource(function))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) \
                    and isinstance(node.comparators[0], ast.Name) \
                    and node.comparators[0].id in ("content", "text"):
                left = node.left
                word = left.value if isinstance(left, ast.Constant) \
                    else getattr(failure_texts, left.id) if isinstance(left, ast.Name) else None
                assert isinstance(word, str), ast.dump(node)
                assert word in inner or any(g in word for g in gate), word
