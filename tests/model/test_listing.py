"""The walk's compact inventory (:class:`auditor.model.Listing`): what a record names is
struck from what no record names, and what it names that the walk saw as no regular
file comes back, each path compared as it is written."""

from __future__ import annotations

import pickle

from auditor.model import Listing
from auditor.model.study import NUL

DIRECTORY = "host-a/attempt-1"


def _listing() -> Listing:
    names = ["allocator-traces/a.jsonl", "link.log", "trial-1.json"]
    return Listing({DIRECTORY: NUL.join(names), "host-b/attempt-2": ""},
                   irregular=frozenset({f"{DIRECTORY}/link.log"}))


def test_a_listing_gives_every_path_in_order_and_survives_pickling() -> None:
    listing = _listing()
    assert list(listing) == [DIRECTORY, "host-b/attempt-2"]
    assert listing[DIRECTORY] == (f"{DIRECTORY}/allocator-traces/a.jsonl",
                                  f"{DIRECTORY}/link.log", f"{DIRECTORY}/trial-1.json")
    assert listing["host-b/attempt-2"] == ()
    assert list(listing.paths()) == list(listing[DIRECTORY])
    again = pickle.loads(pickle.dumps(listing))
    assert again == listing and again.irregular == listing.irregular
    kept = listing.only(lambda directory: directory == DIRECTORY)
    assert list(kept) == [DIRECTORY] and kept.irregular == listing.irregular
    assert listing.only(lambda directory: False).irregular == frozenset()


def test_striking_a_records_paths() -> None:
    listing = _listing()
    left = listing.joined()
    odd = [f"{DIRECTORY}//trial-1.json", f"{DIRECTORY}/missing.json", "protocol.json",
           "host-c/attempt-3/x.json"]
    missed = listing.strike(left, [f"{DIRECTORY}/trial-1.json", f"{DIRECTORY}/link.log",
                                   *odd])
    # the link is struck (it is named) yet comes back as no regular file, as do the odd,
    # missing and unwalked paths; the regular file named is struck silently
    assert missed == {f"{DIRECTORY}/link.log", *odd}
    assert left[DIRECTORY] == "allocator-traces/a.jsonl"
    assert listing.strike(left, [f"{DIRECTORY}/allocator-traces/a.jsonl"]) == frozenset()
    assert left[DIRECTORY] == ""
    # the listing itself is never changed
    assert len(listing[DIRECTORY]) == 3
