"""Test helpers: build studies in temp dirs, edit evidence consistently, snapshot trees."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from auditor._cli import main
from fixtures.generate import (
    MODEL,
    SEED_COMMIT,
    ElementSpec,
    PeriodSpec,
    StudySpec,
    default_protocol,
    write_study,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "fixtures" / "example_study"
SHARED = REPO.parent / "shared"
REAL_EVIDENCE = REPO / "fixtures" / "real-evidence"
"""Public samples of other people's sacct dumps and training logs (their sources in each
folder's ``SOURCES.md``), committed so a clone runs the tests that read them."""


def copy_example(tmp_path: Path) -> Path:
    """A private copy of the committed example study."""
    root = tmp_path / "study"
    shutil.copytree(EXAMPLE, root, symlinks=True)
    return root


def example_catalogue(tmp: Path) -> Path:
    """A catalogue (``auditor catalog``) of an audit of the example study, in ``tmp``."""
    root = copy_example(tmp)
    assert main(["audit", str(root), "--out", str(tmp / "out"), "--quiet", "--no-plots"]) == 0
    assert main(["catalog", str(tmp / "out"), "--into", str(tmp / "cat")]) == 0
    return tmp / "cat"


def outcome_study(root: Path, outcomes: list[str], **knobs: Any) -> Path:
    """A study with one 4-GPU period per outcome (pair ``...-s<161+i>``), one element each."""
    elements: list[ElementSpec] = []
    periods: list[PeriodSpec] = []
    for index, outcome in enumerate(outcomes):
        period = PeriodSpec(pair=f"host-{MODEL}-gsm8k-c2-s{161 + index}", workload="gsm8k",
                            seed=161 + index, model=MODEL, period=1,
                            gpus=2 if outcome == "rollout_init_oom" else 4, outcome=outcome,
                            **knobs)
        periods.append(period)
        copies = 2 if outcome == "retried" else 1
        for _ in range(copies):
            task = len(elements)
            elements.append(ElementSpec(array_task_id=task, job_id=str(7000001 + task),
                                        periods=[period], node=f"gpu-node-{10 + task:02d}"))
    spec = StudySpec(study="test_study", array_job_id="7000000", elements=elements,
                     protocol=default_protocol(periods),
                     execution_commits={p.pair: SEED_COMMIT for p in periods})
    write_study(spec, root)
    return root


def period_spec(seed: int = 161, period: int = 1, gpus: int = 4,
                outcome: str = "completed") -> PeriodSpec:
    """One period of pair ``host-<model>-gsm8k-c2-s<seed>``."""
    return PeriodSpec(pair=f"host-{MODEL}-gsm8k-c2-s{seed}", workload="gsm8k", seed=seed,
                      model=MODEL, period=period, gpus=gpus, outcome=outcome)


def element_study(root: Path, elements: list[tuple[str, list[PeriodSpec]]],
                  sacct_extra_lines: tuple[str, ...] = ()) -> Path:
    """A study of array ``7000000`` whose element ``i`` ran as job ``elements[i][0]`` the
    periods ``elements[i][1]`` (on ``gpu-node-<10 + i>``), with lines added to its dump."""
    periods = [period for _, ran in elements for period in ran]
    write_study(StudySpec(
        study="test_study", array_job_id="7000000",
        elements=[ElementSpec(array_task_id=task, job_id=job, periods=ran,
                              node=f"gpu-node-{10 + task:02d}")
                  for task, (job, ran) in enumerate(elements)],
        protocol=default_protocol(periods),
        execution_commits={p.pair: SEED_COMMIT for p in periods},
        sacct_extra_lines=list(sacct_extra_lines)), root)
    return root


def failed_with_log(root: Path, index: int, log: bytes) -> None:
    """Period ``index`` of an :func:`outcome_study` (pair ``...-s<161+index>``) exited 1, its
    launcher said ``failed``, and its training log is ``log`` (each manifest entry kept)."""
    def failed(data: bytes) -> bytes:
        trial = orjson.loads(data)
        trial["invocation"]["exit_code"] = 1
        trial["status"], trial["validation_error"] = "failed", None
        return orjson.dumps(trial)
    rewrite(root, find(root, f"*-s{161 + index}-4gpu/attempt-*/trial-*.json"), failed)
    rewrite(root, find(root, f"*-s{161 + index}-4gpu/attempt-*/training-*.log"),
            lambda _: log)


def period_records(root: Path) -> list[Path]:
    """Every period record of a study."""
    return sorted((root / "pairs").glob("*/period-*.json"))


def rewrite(root: Path, rel: str, change: Callable[[bytes], bytes],
            update_manifest: bool = True) -> None:
    """Change an evidence file; by default keep its manifest entry consistent with it."""
    path = root / rel
    data = change(path.read_bytes())
    path.write_bytes(data)
    if not update_manifest:
        return
    digest = hashlib.sha256(data).hexdigest()
    for record_path in period_records(root):
        record = orjson.loads(record_path.read_bytes())
        changed = False
        for attempt in record.get("attempts") or [record]:
            for entry in attempt.get("evidence", []):
                if f"{attempt['attempt_dir']}/{entry['path']}" == rel:
                    entry["sha256"], entry["size"] = digest, len(data)
                    changed = True
        if changed:
            record_path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))


def edit_json(root: Path, rel: str, change: Callable[[Any], None],
              update_manifest: bool = True) -> None:
    """Edit a JSON evidence file in place (consistently with its manifest by default)."""
    def apply(data: bytes) -> bytes:
        doc = orjson.loads(data)
        change(doc)
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    rewrite(root, rel, apply, update_manifest)


def edit_record(record_path: Path, change: Callable[[Any], None]) -> None:
    """Edit a period record in place."""
    record = orjson.loads(record_path.read_bytes())
    change(record)
    record_path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))


def find(root: Path, pattern: str) -> str:
    """The root-relative path of the one file matching ``pattern``."""
    matches = sorted(root.glob(pattern))
    assert matches, pattern
    return matches[0].relative_to(root).as_posix()


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """(sha256, mtime_ns) of every file below ``root`` (links not followed)."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                out[str(path.relative_to(root))] = (os.readlink(path), 0)
                continue
            out[str(path.relative_to(root))] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                path.stat().st_mtime_ns)
    return out


def audit(root: Path, out: Path, *extra: str) -> dict[str, Any]:
    """Run ``auditor audit`` through main() and return summary.json."""
    code = main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots", *extra])
    assert code == 0
    return orjson.loads((out / "summary.json").read_bytes())


def sacct_document(capsys: Any, path: Path, *extra: str) -> dict[str, Any]:
    """``auditor sacct PATH --json [extra]``'s document (the command must succeed);
    ``capsys`` is pytest's fixture (what was printed before is dropped)."""
    capsys.readouterr()
    assert main(["sacct", str(path), "--json", *extra]) == 0
    document = orjson.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


def verdicts(summary: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """pair/period -> (verdict, reason)."""
    return {f"{p['pair']}/period-{p['period']}": (p["verdict"], p["reason"])
            for p in summary["periods"]}


def noted_tasks(log: Path, count: int, made: list[int]) -> Iterator[tuple[str, int]]:
    """``count`` :func:`note_task` tasks logging to ``log``, each one's number appended to
    ``made`` as it is taken (what a pool made of a generator, and when)."""
    for number in range(count):
        made.append(number)
        yield str(log), number


SHARED_LOADS: list[int] = []
"""How many times this process unpickled a :class:`SharedValue`."""


class SharedValue:
    """What a test's pool shares: it counts, in each process, the times it is unpickled."""

    def __init__(self, add: int) -> None:
        self.add = add

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpickled_shared, (self.add,)


def _unpickled_shared(add: int) -> SharedValue:
    SHARED_LOADS.append(add)
    return SharedValue(add)


def shared_task(shared: SharedValue, number: int) -> tuple[int, int, int]:
    """A pool task for the tests taking what the pool shares: (the worker's pid, how many
    times it unpickled a shared value so far, ``number`` plus the value's ``add``)."""
    return os.getpid(), len(SHARED_LOADS), number + shared.add


def note_task(task: tuple[str, int]) -> int:
    """A pool task for the tests (a top-level function: workers import it): appends its
    number to the log file ``task[0]`` as it starts, and gives it back."""
    log, number = task
    descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, f"{number}\n".encode())
    finally:
        os.close(descriptor)
    return number


class CountedStr(str):
    """A text that counts the equality tests made of it (``CountedStr.compared``, reset by
    the test): how a look-up scales, measured without a clock."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedStr.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


class CountedInt(int):
    """A number that counts the equality tests made of it (``CountedInt.compared``)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedInt.compared += 1
        return int.__eq__(self, other)

    __hash__ = int.__hash__
