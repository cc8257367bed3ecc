"""The model's faster ``__init__`` (:mod:`auditor.model.construct`): the same arguments,
defaults and values as the one its dataclass wrote, and only where it cannot differ."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest

import auditor.model as model
from auditor.model.construct import quick_init


def _model_classes() -> list[type]:
    found = []
    for module in (model.core, model.evidence, model.kinds, model.presets, model.results,
                   model.study):
        for item in vars(module).values():
            if isinstance(item, type) and item.__module__ == module.__name__ \
                    and dataclasses.is_dataclass(item):
                found.append(item)
    return sorted(found, key=lambda cls: cls.__qualname__)


def _init(cls: type) -> Any:
    return cls.__dict__.get("__init__")


QUICK = [cls for cls in _model_classes() if hasattr(_init(cls), "__wrapped__")]


def test_every_frozen_slotted_model_class_is_quick() -> None:
    """What the audit makes by the million (citations, evidence rows, phase records) is
    made through the faster ``__init__``; a class left out has a reason to be."""
    left = [cls.__qualname__ for cls in _model_classes() if cls not in QUICK]
    names = {cls.__qualname__ for cls in QUICK}
    assert {"Citation", "EvidenceFile", "PhaseRecord", "FileDigest", "EvidenceEntry",
            "InputFile", "PeriodRecord", "Finding", "Verdict"} <= names
    for name in left:
        cls = next(c for c in _model_classes() if c.__qualname__ == name)
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        assert not params.frozen or "__slots__" not in cls.__dict__ \
            or hasattr(cls, "__post_init__") \
            or any(not f.init for f in dataclasses.fields(cls)), name


def _arguments(cls: type) -> tuple[list[object], dict[str, object]]:
    """A distinct object for every field without a default, positional or by keyword as
    the signature takes it."""
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for item in dataclasses.fields(cls):
        if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            if item.kw_only:
                kwargs[item.name] = object()
            else:
                args.append(object())
    return args, kwargs


@pytest.mark.parametrize("cls", QUICK, ids=lambda cls: cls.__qualname__)
def test_the_same_signature_and_values_as_the_dataclass_init(cls: type) -> None:
    quick = _init(cls)
    original = quick.__wrapped__
    made = inspect.signature(quick, follow_wrapped=False).parameters
    wrote = inspect.signature(original).parameters
    assert list(made) == list(wrote)
    for name, parameter in wrote.items():
        assert made[name].kind == parameter.kind, name
        if parameter.default is inspect.Parameter.empty or repr(parameter.default) == "<factory>":
            assert repr(made[name].default) == repr(parameter.default), name
        else:
            assert made[name].default is parameter.default, name
    args, kwargs = _arguments(cls)
    ours = cls(*args, **kwargs)
    theirs: Any = object.__new__(cls)
    original(theirs, *args, **kwargs)
    for item in dataclasses.fields(cls):
        mine, other = getattr(ours, item.name), getattr(theirs, item.name)
        if item.default_factory is not dataclasses.MISSING:
            assert mine == other and mine is not other, item.name  # (a fresh one each)
        else:
            assert mine is other, item.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(ours, dataclasses.fields(cls)[0].name, None)
    with pytest.raises(TypeError):
        cls(*args, object(), *([object()] * len(dataclasses.fields(cls))), **kwargs)
    if args:
        with pytest.raises(TypeError):
            cls(*args[:-1], **kwargs)


def test_real_values_compare_hash_and_pickle_as_before() -> None:
    cite = model.Citation("a/b.jsonl", 3, "/phase", "forward")
    assert cite == model.Citation("a/b.jsonl", 3, "/phase", "forward")
    assert hash(cite) == hash(model.Citation("a/b.jsonl", 3, "/phase", "forward"))
    assert model.Citation("a/b.jsonl").line is None
    assert pickle.loads(pickle.dumps(cite)) == cite
    assert dataclasses.replace(cite, line=4).line == 4
    options = model.AuditOptions(jobs=2)
    assert options.jobs == 2 and options.max_findings == model.AuditOptions().max_findings


def test_keyword_only_fields_stay_keyword_only() -> None:
    @dataclass(frozen=True, slots=True)
    class Keyed:
        a: int
        b: int = field(kw_only=True)
        c: list[int] = field(default_factory=list, kw_only=True)

    assert quick_init(Keyed)
    assert Keyed(1, b=2) == Keyed(a=1, b=2, c=[])
    with pytest.raises(TypeError):
        Keyed(1, 2)  # type: ignore[call-arg]
    first, second = Keyed(1, b=2), Keyed(1, b=2)
    assert first.c == [] and first.c is not second.c


def test_a_class_it_would_change_is_left_as_it_was() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(frozen=True, slots=True)
    class Derived:
        a: int
        b: int = field(init=False, default=2)

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        scale: InitVar[int] = 1

    @dataclass(slots=True)
    class Mutable:
        a: int

    for cls in (Checked, Unslotted, Derived, WithInitVar, Mutable):
        before = _init(cls)
        assert not quick_init(cls), cls.__qualname__
        assert _init(cls) is before
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)


def test_a_subclass_sets_its_bases_fields_too() -> None:
    @dataclass(frozen=True, slots=True)
    class Base:
        a: int

    @dataclass(frozen=True, slots=True)
    class Child(Base):
        b: str = "x"

    assert quick_init(Child)
    child = Child(1)
    assert (child.a, child.b) == (1, "x") and child == Child(1, "x")
