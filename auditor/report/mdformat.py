"""Markdown text for the report: escaping, code spans and blocks, tables, times, numbers.

Everything quoted from evidence goes through :func:`md_escape` or :func:`code_block`, so a
log line cannot inject markup, links or HTML.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from auditor._io import clip

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~\"'$])")
_PLAIN = re.compile(r"[A-Za-z0-9 ,.:;/@%=-]*")
"""Text that :func:`md_escape` leaves as it is (unless it starts like :data:`_LEADING`)."""
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve")
_LEADING = re.compile(r"^([-=]|\d+\.)")


def md_escape(text: str, limit: int = 300) -> str:
    """Untrusted text as inert markdown: control characters removed, specials escaped,
    HTML neutralised, clipped to ``limit`` characters."""
    if len(text) <= limit and _PLAIN.fullmatch(text) and not _LEADING.match(text):
        return text  # the common case (names, numbers, times): nothing to do
    text = _CONTROL.sub("", text.replace("\r", " ").replace("\n", " "))
    text = clip(text, limit)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    # a leading "-", "=" or digit-dot could start a list or heading line; escape it
    return _LEADING.sub(r"\\\1", text)


def code_span(text: str, limit: int = 200) -> str:
    """Untrusted text as an inline code span (fenced by enough backticks)."""
    text = clip(_CONTROL.sub("", text.replace("\r", " ").replace("\n", " ")), limit)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(lines: Iterable[str], info: str = "text") -> str:
    """Untrusted lines as a fenced code block whose fence no line can close."""
    body = [_CONTROL.sub("", line) for line in lines]
    longest = max((len(m) for line in body for m in re.findall(r"`{3,}|~{3,}", line)),
                  default=0)
    fence = "`" * max(3, longest + 1)
    return "\n".join([fence + info, *body, fence])


def number(n: int) -> str:
    """Small counts as words, as a person writes them."""
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else f"{n:,}"


def utc(ns: int | None, with_date: bool = False) -> str:
    """Nanoseconds since the epoch as ``HH:MM:SS.nnnnnnnnn`` UTC (optionally dated)."""
    if ns is None:
        return "—"
    seconds, frac = divmod(ns, 1_000_000_000)
    moment = datetime.fromtimestamp(seconds, UTC)
    text = f"{moment:%H:%M:%S}.{frac:09d}"
    return f"{moment:%Y-%m-%d} {text}" if with_date else text


def utc_seconds(seconds: int | None, with_date: bool = True) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS`` UTC."""
    if seconds is None:
        return "unknown"
    moment = datetime.fromtimestamp(seconds, UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}" if with_date else f"{moment:%H:%M:%S}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]],
          align: Sequence[str] | None = None) -> str:
    """A markdown table; cells must already be escaped."""
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)

