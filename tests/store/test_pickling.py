"""Records cross process boundaries: their pickled form must rebuild them exactly, and the
quick form the store registers shapes no type (keyword-only fields, subclasses)."""

from __future__ import annotations

import copy
import copyreg
import pickle
from dataclasses import dataclass, field, replace

from auditor.model import Citation, Finding, PeriodRecord, Severity
from auditor.store import pickles_fast


@pickles_fast
@dataclass(frozen=True, slots=True)
class _One:
    value: int


@pickles_fast
@dataclass(frozen=True, slots=True)
class _Keyword:
    value: int
    named: str = field(default="d", kw_only=True)


@dataclass(frozen=True, slots=True)
class Sub(Citation):
    extra: str = "default"


def test_records_round_trip_through_pickle() -> None:
    cite = Citation("pairs/a/period-1.json", pointer="/attempts/0", quote="q")
    item = Finding("AUD101", "evidence-missing", Severity.ERROR, "pairs/a", "gone", (cite,))
    for record in (cite, item, _One(7), _Keyword(3, named="kept")):
        back = pickle.loads(pickle.dumps(record, pickle.HIGHEST_PROTOCOL))
        assert back == record and type(back) is type(record)
        assert copy.copy(record) == record
    # the quick form is the field values in order, so defaults and replace() are unaffected
    assert copyreg.dispatch_table[Citation](cite) == (
        Citation, ("pairs/a/period-1.json", None, "/attempts/0", "q"))
    assert replace(cite, line=3).locator() == "pairs/a/period-1.json:3"


def test_the_model_types_are_registered_and_a_subclass_pickles_whole() -> None:
    assert Citation in copyreg.dispatch_table and PeriodRecord in copyreg.dispatch_table
    # (registration is by exact type: the parent's quick form would drop ``extra``)
    back = pickle.loads(pickle.dumps(Sub("p", extra="kept")))
    assert back.extra == "kept" and back.path == "p"
