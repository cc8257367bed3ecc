"""Records cross process boundaries: their pickled form must rebuild them exactly."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field, replace

import pytest

from auditor.model import Citation, Finding, Severity, fast_pickle


@fast_pickle
@dataclass(frozen=True, slots=True)
class _One:
    value: int


def test_records_round_trip_through_pickle() -> None:
    cite = Citation("pairs/a/period-1.json", pointer="/attempts/0", quote="q")
    item = Finding("AUD101", "evidence-missing", Severity.ERROR, "pairs/a", "gone", (cite,))
    for record in (cite, item, _One(7)):
        back = pickle.loads(pickle.dumps(record, pickle.HIGHEST_PROTOCOL))
        assert back == record and type(back) is type(record)
        assert copy.copy(record) == record
    # the reduce is the field values in order, so defaults and replace() are unaffected
    assert Citation.__reduce__(cite) == (Citation, ("pairs/a/period-1.json", None, "/attempts/0",
                                                    "q"))
    assert replace(cite, line=3).locator() == "pairs/a/period-1.json:3"


def test_fast_pickle_refuses_what_it_would_get_wrong() -> None:
    @dataclass(frozen=True, slots=True)
    class Sub(Citation):
        extra: str = "default"

    with pytest.raises(TypeError, match="needs its own fast_pickle"):
        pickle.dumps(Sub("p", extra="kept"))
    with pytest.raises(TypeError, match="positional"):
        @fast_pickle
        @dataclass(frozen=True, slots=True)
        class Keyword:
            value: int = field(kw_only=True)
