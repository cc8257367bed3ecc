"""Markdown text for the report: prose, code spans and blocks, tables, times, numbers.

Everything quoted from evidence goes through :func:`prose`, :func:`code_span` or
:func:`code_block`, so a log line cannot inject markup, links or HTML: identifiers, paths
and anything holding a markdown special character become code spans (fenced by more
backticks than they hold), and the rest is plain words, which need no escape.
:func:`md_escape` (backslash escapes) remains for callers that need escaped text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime

from auditor._text import clip
from auditor.store import SortedRows

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
    if text and len(text) <= limit and _SPAN_AS_IS.search(text) is None:
        return f"`{text}`"  # the common case (a path, a name): one backtick, nothing removed
    text = clip(_CONTROL.sub("", text.replace("\r", " ").replace("\n", " ")), limit)
    return _span(text)


_SPAN_AS_IS = re.compile(_CONTROL.pattern[:-1] + "\n`]")
"""What a code span may not show as it is: a control character, a newline, a backtick."""


def _span(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_CODEY = re.compile(r"[\\`*_~$|<>\[\]&{}]|://|^www\.|@\S*\.")
"""A word holding any of these is shown as code: markup, an HTML tag or entity, a link
GitHub would make of it, or an identifier (``estimation_host_capacity``)."""
_STARTS_BLOCK = re.compile(r"^([-+=>#*]|\d+[.)])")
_TRAILING = ".,;:!?"


def prose(text: str, limit: int = 300) -> str:
    """Untrusted text as an inert sentence: a part between backticks (as the reasoning
    writes names) and every word :data:`_CODEY` matches become code spans; the other
    words are plain (a parenthesis, colon or quote mark is no markup outside a link,
    and no link can open). Control characters are removed, the text clipped."""
    if len(text) <= limit and _PROSE_AS_IS.search(text) is None \
            and _STARTS_BLOCK.match(text) is None:
        return text  # the common case (a workload's name, a sentence): nothing to do
    text = clip(_CONTROL.sub("", text.replace("\r", " ").replace("\n", " ")), limit)
    out: list[str] = []
    position = 0
    for match in SPANNED.finditer(text):
        out.append(_words(text[position:match.start()], not out))
        inner = match.group(2)  # (a fence of more backticks holds fewer in a row, padded)
        padded = len(inner) > 2 and inner[0] == inner[-1] == " " and inner.strip()
        out.append(_span(inner[1:-1] if padded else inner))
        position = match.end()
    out.append(_words(text[position:], not out))
    return "".join(out)


_PROSE_AS_IS = re.compile(_CONTROL.pattern[:-1] + r"\r\n`\\*_~$|<>\[\]&{}]|://|www\.|@\S*\.")
"""What :func:`prose` would change: a control character, a line break, a code span's
backtick, or what :data:`_CODEY` finds in a word (``www.`` anywhere)."""

SPANNED = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
"""A code span as the reasoning writes one: a fence, text, the same fence."""


def _words(text: str, at_start: bool) -> str:
    """Plain words as they are, the others (see :func:`prose`) as code spans."""
    def word(match: re.Match[str]) -> str:
        token = match.group()
        head = ""
        while token[:1] in ("(", '"', "“") and len(token) > 1:
            head, token = head + token[0], token[1:]
        tail = ""
        while len(token) > 1 and (token[-1] in _TRAILING or (
                token[-1] == ")" and token.count("(") < token.count(")"))):
            token, tail = token[:-1], token[-1] + tail
        if (at_start and match.start() == 0 and _STARTS_BLOCK.match(match.group())) \
                or _CODEY.search(head + tail):
            return _span(match.group())  # (a line's first word could open a block)
        if _CODEY.search(token):
            return head + _span(token) + tail
        return head + token + tail

    return re.sub(r"\S+", word, text)


def figure(value: float | int, places: int = 6) -> str:
    """A figure as a person writes it: a whole number whole (``1,110``), a fraction to
    ``places`` decimals (``17,605.783111``)."""
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{places}f}"


_FENCES = re.compile(r"`{3,}|~{3,}")


def code_block(lines: Iterable[str], info: str = "text") -> str:
    """Untrusted lines as a fenced code block whose fence no line can close."""
    block = SpilledCodeBlock(info)
    for line in lines:
        block.add(line)
    return "\n".join(block)


class SpilledCodeBlock:
    """A fenced code block of untrusted lines (:func:`code_block`; a million periods'
    PIDs), given a line at a time and read back a line at a time: the lines wait on disk
    (:class:`~auditor.store.SortedRows`, in the order added) while the fence is found,
    not in memory (they were about 40 MB there, with the block made of them)."""

    def __init__(self, info: str = "text") -> None:
        self._info = info
        self._body = SortedRows(0)
        self._longest = 0

    def add(self, line: str) -> None:
        """The block's next line (untrusted)."""
        clean = _CONTROL.sub("", line.replace("\r", " ").replace("\n", " "))  # (one line)
        self._longest = max(self._longest,
                            max((len(m) for m in _FENCES.findall(clean)), default=0))
        self._body.extend(((len(self._body), clean),))

    def __iter__(self) -> Iterator[str]:
        """The block's lines, its fences first and last."""
        fence = "`" * max(3, self._longest + 1)
        yield fence + self._info
        yield from (line for _, line in self._body)
        yield fence


def number(n: int) -> str:
    """Small counts as words, as a person writes them."""
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else f"{n:,}"


def utc(ns: int | None, with_date: bool = False) -> str:
    """Nanoseconds since the epoch as ``HH:MM:SS.nnnnnnnnn`` UTC (optionally dated)."""
    if ns is None:
        return "—"
    seconds, frac = divmod(ns, 1_000_000_000)
    # (the clock by arithmetic, the date once a day: a report formats every period's times)
    day, clock = divmod(seconds, 86_400)
    text = f"{clock // 3600:02d}:{clock // 60 % 60:02d}:{clock % 60:02d}.{frac:09d}"
    return f"{utc_day(day)} {text}" if with_date else text


@functools.lru_cache(maxsize=64)
def utc_day(day: int) -> str:
    """Day ``day`` since the epoch as ``YYYY-MM-DD`` (UTC); ``ns // NS_PER_DAY`` of a time."""
    return f"{datetime.fromtimestamp(day * 86_400, UTC):%Y-%m-%d}"


NS_PER_DAY = 86_400 * 1_000_000_000


def utc_seconds(seconds: int | None, with_date: bool = True) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS`` UTC."""
    if seconds is None:
        return "unknown"
    try:
        moment = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):  # (past any calendar: as it is)
        return f"epoch {seconds}"
    return f"{moment:%Y-%m-%d %H:%M:%S}" if with_date else f"{moment:%H:%M:%S}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]],
          align: Sequence[str] | None = None) -> str:
    """A markdown table; cells must already be inert (:func:`prose`, :func:`code_span`).
    A ``|`` in a cell (in a code span too: GitHub splits cells first) is escaped."""
    return "\n".join(table_lines(header, rows, align))


def table_lines(header: Sequence[str], rows: Iterable[Sequence[str]],
                align: Sequence[str] | None = None) -> Iterator[str]:
    """:func:`table`'s lines, a row's as it comes."""
    align = align or ["---"] * len(header)
    yield "| " + " | ".join(header) + " |"
    yield "| " + " | ".join(align) + " |"
    for row in rows:
        yield "| " + " | ".join(_cell(cell) for cell in row) + " |"


def _cell(text: str) -> str:
    """``text`` with every ``|`` not already escaped (an odd run of backslashes before
    it) escaped."""
    if "|" not in text:
        return text
    return re.sub(r"(\\*)\|", lambda m: m.group(1) + ("|" if len(m.group(1)) % 2
                                                      else "\\|"), text)
