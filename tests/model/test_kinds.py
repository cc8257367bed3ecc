"""The evidence kinds, declared once (:mod:`auditor.model.kinds`): every kind has a reader,
the names the kit writes are the names the audit parses and ``auditor seal`` lists, and no
module of the package spells a kind's word or file name otherwise."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from auditor.collect.kinds import READ_ORDER, READERS
from auditor.model.kinds import (
    ALLOCATOR_TRACE,
    DEVICE_EVIDENCE,
    KINDS,
    OTHER,
    PER_WORKER,
    TRAINING_LOG,
    TRIAL,
    EvidenceKind,
    kind_of,
)

PACKAGE = Path(__file__).resolve().parents[2] / "auditor"

SAMPLE = {"job": "5055845", "pid": 3657525, "rank": 3, "role": "actor_rollout", "host": "gpu-n2",
          "name": "trainer_state.json"}
def test_every_kind_has_its_reader_and_every_reader_its_kind() -> None:
    assert set(READERS) == set(KINDS)
    assert sorted(KINDS, key=READ_ORDER.__getitem__)[0] == TRIAL.name  # (its step count first)


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_a_name_the_kit_writes_is_one_the_audit_parses_and_seal_lists(kind: EvidenceKind) -> None:
    written = kind.path_for(**SAMPLE)
    assert written.startswith(f"{kind.directory}/" if kind.directory else "")
    assert kind_of(written) == kind.name
    parts = kind.parts(written)
    assert parts is not None
    assert parts == {name: str(SAMPLE[name]) for name in parts}
    if kind.per_worker:
        assert kind.worker_of(written) == (SAMPLE["host"], SAMPLE["pid"])
        v1 = kind.path_for(**{k: v for k, v in SAMPLE.items() if k != "host"})
        assert kind.worker_of(v1) == (None, SAMPLE["pid"])  # (a v1 name still reads)
        assert kind_of(v1) == kind.name


def test_names_the_audit_refuses() -> None:
    assert ALLOCATOR_TRACE.pid_of("allocator-traces/allocator-x.jsonl") is None
    assert ALLOCATOR_TRACE.pid_of("allocator-" + "9" * 21 + ".jsonl") is None  # (past 64 bits)
    assert DEVICE_EVIDENCE.parts("worker-0-1.json") is None  # (no role)
    # seal: a loosely named trace is still a trace (the audit says what is wrong with its
    # name); the same name outside its folder is no kind
    assert kind_of("allocator-traces/allocator-x.jsonl") == ALLOCATOR_TRACE.name
    assert kind_of("allocator-1.jsonl") == OTHER
    assert kind_of("logs/training-1.log") == OTHER
    assert kind_of("training-1.log") == TRAINING_LOG.name


def test_per_worker_kinds_come_in_their_read_order() -> None:
    """A worker's missing files are reported device evidence first, then its trace (as
    before the table: the diagnosis quotes the first)."""
    assert [kind.name for kind in PER_WORKER] == ["device_evidence", "allocator_trace"]


FIELD_WORDS = {"idle_check", "processes", "idle"}
"""Words of a v1.2 kind that are also the contract's field or phase names (the period
record's ``idle_check``, the trial record's ``processes``, the ``idle`` phase): as a bare
word they are those; only as a folder in a path are they the kind's."""


def _spelled(kind: EvidenceKind) -> list[re.Pattern[str]]:
    """How a module would spell ``kind`` if it did not read the table: its word (all but
    ``trial``, which prose uses too), its folder, or a file name of its form."""
    stem = kind.names[0].template.rsplit("/", 1)[-1].split("{", 1)[0]
    extension = kind.names[0].template.rsplit(".", 1)[-1]
    found = [re.compile(rf"(^|/){re.escape(stem)}.*\.{extension}$")] if stem else []
    # (a name with no prefix of its own, <host>.json, is spelled by its folder only)
    if kind is not TRIAL and kind.name not in FIELD_WORDS:
        found.append(re.compile(rf"^{re.escape(kind.name)}$"))
    if kind.directory:
        end = "/(?![0-9{])" if kind.directory in FIELD_WORDS else "(/|$)"  # (not a pointer)
        found.append(re.compile(rf"(^|/){re.escape(kind.directory)}{end}"))
    return found


def _constants(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant of a module but its docstrings, with its line; an f-string as
    its text with ``{}`` for each field (``f"allocator-{pid}.jsonl"`` ->
    ``allocator-{}.jsonl``)."""
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    # (an attribute's docstring: a bare string statement after an assignment)
    docstrings |= {id(node.value) for node in ast.walk(tree)
                   if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            docstrings.update(id(part) for part in node.values)  # (read whole, below)
            found.append((node.lineno, "".join(
                str(part.value) if isinstance(part, ast.Constant) else "{}"
                for part in node.values)))
    found.extend((node.lineno, node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and id(node) not in docstrings)
    return found


def test_no_module_spells_a_kind_but_the_table() -> None:
    patterns = [(kind.name, pattern) for kind in KINDS.values() for pattern in _spelled(kind)]
    spelled: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "model" / "kinds.py" or "_example_study" in path.parts:
            continue
        for line, text in _constants(ast.parse(path.read_text("utf-8"))):
            spelled.extend(f"{path.relative_to(PACKAGE)}:{line}: {text!r} ({name})"
                           for name, pattern in patterns if pattern.search(text))
    assert spelled == []
