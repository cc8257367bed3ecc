"""Root-relative path text: how every stage names a file of the evidence root.

Paths in records are POSIX strings relative to the root; a manifest's parts are joined and
normalised here, by string operations only (no file system is consulted).
"""

from __future__ import annotations

import re

from auditor.model.core import INT64_MAX

_PERIOD_FILE = re.compile(r"period-(0|[1-9][0-9]{0,18})\.json")


def period_number(name: str) -> int | None:
    """The period a record's file name gives: ``period-<n>.json``, ``n`` in ASCII digits
    without a leading zero and at most a signed 64-bit integer (what the tables hold);
    None for any other name. One spelling per period: ``period-01.json`` or
    ``period-\u0661.json`` (an Arabic-Indic one) is no period record, so never a second
    record of period 1."""
    match = _PERIOD_FILE.fullmatch(name)
    if match is None:
        return None
    number = int(match[1])
    return number if number <= INT64_MAX else None


def join_text(*parts: str) -> str | None:
    """Join manifest path parts into a normalised POSIX string (``a/./b//c`` -> ``a/b/c``);
    None when any part is empty or absolute or has a ``..`` part. String operations only,
    as it runs for every listed file (several times)."""
    for part in parts:
        wrapped = f"/{part}/"
        if (not part or "\\" in part or part[1:2] == ":" or "//" in wrapped
                or "/./" in wrapped or "/../" in wrapped or "\0" in part):
            return _join_pieces(parts)
    return "/".join(parts) if parts else None  # the usual case: already normal


def _join_pieces(parts: tuple[str, ...]) -> str | None:
    pieces: list[str] = []
    for part in parts:
        text = part.replace("\\", "/")
        if not text or text[0] == "/" or (len(text) > 1 and text[1] == ":") or "\0" in text:
            return None  # (no file name holds a NUL: the system cannot even be asked)
        for piece in text.split("/"):
            if piece == "..":
                return None
            if piece and piece != ".":
                pieces.append(piece)
    return "/".join(pieces) if pieces else None
