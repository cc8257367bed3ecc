"""Record framing: physical lines into rows of exactly one value per field.

:class:`_Framer` reads the dump's lines, settles its :class:`~.format._Format` on the
first rows, and frames each record: a value holding the delimiter is given back to a
free-text column, a row cut by a newline inside a value is joined with the lines after
it, a last column that holds newlines is continued; rows that fit nowhere are AUD008
findings. Each framed record goes to :meth:`_Framer._row` (the job assembly, in
:mod:`auditor.collect.sacct.jobs`).
"""

from __future__ import annotations

from collections import Counter
from typing import cast

from auditor import rules
from auditor._io import CHUNK_SIZE, HashingReader, Line, iter_lines
from auditor._text import clip
from auditor.collect.sacct.encoding import Transcoded
from auditor.collect.sacct.format import (
    _AMBIGUOUS,
    _FREE_TEXT,
    _KNOWN,
    _LENIENT,
    _MANY,
    _MULTILINE,
    _OK,
    _SHORT,
    _VALUES,
    CAPTURE_HINT,
    DEFAULT_FORMAT,
    MAX_FINDINGS,
    MAX_JOIN_LINES,
    MAX_LINE,
    MAX_RECORD_CHARS,
    REFUSE_AFTER,
    SNIFF_CHARS,
    SNIFF_LINES,
    _Format,
    _Phys,
    _sniff_delimiter,
    _split_header,
    is_fixed_width,
    is_frame_line,
)
from auditor.collect.sacct.values import _CHECKS
from auditor.errors import SacctFormatError
from auditor.model import Citation, Finding


def plain_format(fields: tuple[str, ...], delimiter: str, header: bool = False,
                 trailing: bool = False) -> _Format:
    """The :class:`_Format` of ``fields`` split on ``delimiter`` (what the first rows
    settle; ``sacct --json`` records are turned into rows of :data:`JSON_FIELDS` with it)."""
    n = len(fields)
    index: dict[str, int] = {}
    for position, name in enumerate(fields):
        index.setdefault(name.lower(), position)
    free = tuple(
        position for position, name in enumerate(fields)
        if name.lower() in _FREE_TEXT and index[name.lower()] == position
    )
    checks = tuple(
        (position, _CHECKS[name.lower()]) for position, name in enumerate(fields)
        if name.lower() in _CHECKS and index[name.lower()] == position
    )
    core = tuple(
        (position, check) for position, check in checks
        if fields[position].lower() not in _LENIENT
    )
    return _Format(
        fields=fields,
        delimiter=delimiter,
        header=header,
        header_key=tuple(name.lower() for name in fields) if header else None,
        trailing=trailing,
        index=index,
        free=free,
        checks=checks,
        core=core,
        open_last=fields[-1].lower() in _MULTILINE and index[fields[-1].lower()] == n - 1,
    )


class _Framer:
    """Frames one dump's records; a subclass's :meth:`_row` uses each."""

    def __init__(self, path: str, fields: tuple[str, ...] | None, delimiter: str | None) -> None:
        self.path = path
        self.fields_arg = fields
        self.delimiter_arg = delimiter
        self.fmt: _Format | None = None
        self.findings: list[Finding] = []
        self.dropped = 0
        self.pending: list[_Phys] = []
        """Physical lines of a record cut by a newline inside a value, so far."""
        self.pending_count = 0
        self.pending_chars = 0
        self.ok_rows = 0
        self.bad_rows = 0
        self.bad_counts: Counter[int] = Counter()
        self.bad_values = 0
        self.value_sample = ""
        self.held: tuple[int, str, list[str]] | None = None
        self.any_bytes = False
        self.any_rows = False
        self.fitting: list[set[str]] = []
        """Per column, values already seen to pass its shape check (up to
        :data:`_FITTING_KEPT` each): states, exit codes and TRES repeat on most rows."""

    def _row(self, number: int, values: list[str], text: str) -> None:
        """Use one framed record (line ``number``, its ``values``, its ``text``)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- driving

    def _read(self, reader: HashingReader, first: _Prefixed | None = None) -> _Format:
        """Read every line (``first``: ``reader`` with its first chunk, read already, given
        back): settle the format on the first rows, then frame each record; refuse
        (SacctFormatError) a dump none of whose rows fits."""
        lines = iter_lines(reader if first is None else cast(HashingReader, first), MAX_LINE)
        window: list[_Phys] = []
        meaningful = 0
        chars = 0
        for line in lines:
            phys = self._decode(line)
            window.append(phys)
            if not phys.skip and not phys.clipped:
                meaningful += 1
                chars += len(phys.text)
                if meaningful >= SNIFF_LINES or chars >= SNIFF_CHARS:
                    break
        self.fmt = self._configure(window)
        self.fitting = [set() for _ in self.fmt.fields]
        for phys in window:
            self._process(phys)
        for line in lines:
            self._process(self._decode(line))
        self._flush()
        reader.drain()
        if self.ok_rows == 0 and self.bad_rows:
            self._refuse()
        return self.fmt

    def _decode(self, line: Line) -> _Phys:
        self.any_bytes = True
        data = line.data
        if line.clipped:
            self._find("AUD007", line.number, "", length=line.length, limit=MAX_LINE)
            return _Phys(line.number, "", skip=False, clipped=True)
        if b"\x00" in data:
            self._find("AUD006", line.number, "")
            data = data.replace(b"\x00", b"")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            self._find("AUD005", line.number, text)
        if line.number == 1 and text.startswith("\ufeff"):
            text = text[1:]
        stripped = text.strip()
        skip = not stripped or stripped[0] == "#" \
            or (stripped[0] == "-" and is_frame_line(stripped))  # (no call for a row)
        return _Phys(line.number, text, skip=skip, clipped=False)

    # ---------------------------------------------------------------- format

    def _configure(self, window: list[_Phys]) -> _Format:
        texts = [p.text for p in window if not p.skip and not p.clipped]
        framed = [p.text for p in window if not p.clipped and is_frame_line(p.text.strip())]
        if is_fixed_width([*framed, *texts], self.delimiter_arg):
            raise SacctFormatError(
                f"{self.path}: fixed-width sacct output (no -P) cannot be read safely, values "
                f"may be cut to the column width; capture a parsable dump with: {CAPTURE_HINT}"
            )
        header = _split_header(texts[0], self.delimiter_arg) if texts else None
        if header is not None:
            names, delimiter = header
            fields: tuple[str, ...] = tuple(names)
            self._header_against_format(fields, window)
        else:
            fields = self.fields_arg or DEFAULT_FORMAT
            delimiter = self.delimiter_arg or _sniff_delimiter(texts, len(fields))
        n = len(fields)
        counts = [text.split(delimiter) for text in texts]
        with_trailing = sum(1 for parts in counts if len(parts) == n + 1 and parts[-1] == "")
        exact = sum(1 for parts in counts if len(parts) == n)
        if header is None:
            self._refuse_extra_fields(fields, delimiter, counts)
        return plain_format(fields, delimiter, header is not None, with_trailing > exact)

    def _refuse_extra_fields(self, fields: tuple[str, ...], delimiter: str,
                             counts: list[list[str]]) -> None:
        """Refuse a headerless dump every first row of which has the same number of fields,
        more than the format's (a field more, as ``Restarts``; not a ``-p`` trailing
        delimiter): the extra values would be folded into a free-text column, misread."""
        n = len(fields)
        if not counts:  # (one row too: sacct -X of one job prints one)
            return
        found = len(counts[0])
        if found <= n or any(len(parts) != found for parts in counts):
            return
        if found == n + 1 and all(parts[-1] == "" for parts in counts):
            return  # sacct -p: every row ends in the delimiter
        checks = [(i, _CHECKS.get(name.lower())) for i, name in enumerate(fields)]
        if not all(check is None or check.fullmatch(parts[i].strip())
                   for parts in counts for i, check in checks):
            return  # (read as they come, a typed column fails: the delimiter is inside a
            # text field, a job name's, which the reader absorbs: -P does not escape it)
        raise SacctFormatError(
            f"{self.path}: every row has {found} fields split on {delimiter!r} where the "
            f"format has {n} ({','.join(fields)}): a dump with more fields than its format is "
            "refused, never folded into its last field; pass the --format it was captured "
            + (f"with (e.g. --format={','.join(fields)},Restarts)" if found == n + 1 else "with")
        )

    def _header_against_format(self, fields: tuple[str, ...], window: list[_Phys]) -> None:
        """One finding when the dump's header names other fields than ``--format`` gave:
        the header, what the file itself says, is used."""
        given = self.fields_arg
        if given is None or tuple(f.lower() for f in given) == tuple(f.lower() for f in fields):
            return
        line = next((p for p in window if not p.skip and not p.clipped), None)
        self._find(
            "AUD023", line.number if line is not None else 1, line.text if line else "",
            error=f"the header line names {len(fields)} fields ({clip(','.join(fields), 200)}), "
                  f"--format gave {len(given)} ({clip(','.join(given), 200)}): the header was "
                  "used, --format ignored",
        )

    def _is_header_again(self, text: str) -> bool:
        fmt = self.fmt
        assert fmt is not None
        first = text.lstrip()[:1]
        if not first.isalpha():
            return False
        parts = [part.strip().lower() for part in text.split(fmt.delimiter)]
        if parts and parts[-1] == "" and len(parts) > 1:
            parts.pop()
        if fmt.header_key is not None and tuple(parts) == fmt.header_key:
            return True
        return len(parts) > 1 and all(part in _KNOWN for part in parts)

    # ---------------------------------------------------------------- records

    def _fit(self, text: str, strict: bool, absorb: bool = True
             ) -> tuple[str, list[str] | None]:
        """Split one (possibly joined) record into exactly one value per field; ``absorb``:
        extra fields may be given back to a free-text column that holds the delimiter."""
        fmt = self.fmt
        assert fmt is not None
        n = len(fmt.fields)
        parts = text.split(fmt.delimiter)
        count = len(parts)
        if count < n:
            return _SHORT, None
        normal: list[str] | None = None
        if count == n:
            if fmt.trailing and parts[-1] == "":
                return _SHORT, None  # (sacct -p ends every row in the delimiter: one short)
            normal = parts
        elif fmt.trailing and count == n + 1 and parts[-1] == "":
            normal = parts[:-1]
        if normal is not None:
            if not self._plausible(normal, strict):
                return (_MANY, None) if strict else (_VALUES, normal)
            return _OK, normal
        if not absorb:
            return _MANY, None
        # Too many fields: a free-text value holds the delimiter (and maybe the
        # line has a trailing one). Keep the readings whose typed columns are sane.
        plain = [self._absorb(parts, k) for k in fmt.free]
        trimmed: list[list[str]] = []
        if parts[-1] == "":
            rest = parts[:-1]
            if len(rest) == n:
                trimmed.append(rest)
            else:
                trimmed.extend(self._absorb(rest, k) for k in fmt.free)
        groups = (trimmed, plain) if fmt.trailing else (plain, trimmed)
        for group in groups:
            good = [values for values in group if self._plausible(values, True)]
            if len(good) == 1:
                return _OK, good[0]
            if len(good) > 1:
                return _AMBIGUOUS, None
        return _MANY, None

    def _absorb(self, parts: list[str], column: int) -> list[str]:
        fmt = self.fmt
        assert fmt is not None
        extra = len(parts) - len(fmt.fields)
        joined = fmt.delimiter.join(parts[column:column + extra + 1])
        return [*parts[:column], joined, *parts[column + extra + 1:]]

    def _plausible(self, values: list[str], strict: bool) -> bool:
        fmt = self.fmt
        assert fmt is not None
        fitting = self.fitting
        for position, check in fmt.checks if strict else fmt.core:
            value = values[position]
            seen = fitting[position]
            if value in seen:
                continue
            if not check.fullmatch(value.strip()):
                return False
            if len(seen) < _FITTING_KEPT:  # (ids and times never repeat: a bound)
                seen.add(value)
        return True

    def _unfit_columns(self, values: list[str]) -> str:
        fmt = self.fmt
        assert fmt is not None
        return ", ".join(
            f"{fmt.fields[position]} {clip(values[position], 40)!r}"
            for position, check in fmt.core
            if not check.fullmatch(values[position].strip())
        )

    def _process(self, phys: _Phys) -> None:
        fmt = self.fmt
        assert fmt is not None
        if self.held is not None:
            if self._continues_held(phys):
                return
            self._commit_held()
        if self.pending:
            if phys.clipped:
                self._flush()
                return
            n = len(fmt.fields)
            count = self._count(phys)
            if (
                not phys.skip
                and count >= n
                and self._fit(phys.text, strict=False)[0] in (_OK, _VALUES)
            ):
                # A line that is a whole row on its own never continues a cut one.
                self._flush()
                self._process(phys)
                return
            total = self.pending_count + count - 1
            chars = self.pending_chars + 1 + len(phys.text)
            if total < n:
                if len(self.pending) + 1 < MAX_JOIN_LINES and chars <= MAX_RECORD_CHARS:
                    self.pending.append(phys)
                    self.pending_count, self.pending_chars = total, chars
                    return
                # Too long a join: every piece is short, and so is any run of them.
                pieces, self.pending = self.pending, []
                for piece in pieces:
                    if not piece.skip:
                        self._bad_count(piece.number, piece.text, _SHORT)
                self._process(phys)
                return
            joined = "\n".join(piece.text for piece in (*self.pending, phys))
            # A newline inside a value adds no delimiter: a join must give exactly the
            # format's fields. (Given back to a free-text column, the extra fields of two
            # rows each a field short would read as one row: the second one misread.)
            status, values = self._fit(joined, strict=True, absorb=False)
            if status == _OK and values is not None:
                first = self.pending[0].number
                self.pending = []
                self._accept(first, joined, values)
                return
            self._flush_first()
            self._process(phys)
            return
        if phys.skip or phys.clipped:
            return
        if self._is_header_again(phys.text):
            return
        status, values = self._fit(phys.text, strict=False)
        if status != _OK and phys.text[:1] in _QUOTES:
            unquoted = _unquote(phys.text, fmt.delimiter)
            if unquoted != phys.text:
                retry = self._fit(unquoted, strict=False)
                if retry[0] == _OK:
                    phys.text, phys.count = unquoted, -1
                    status, values = retry
        if status == _OK and values is not None:
            self._accept(phys.number, phys.text, values)
        elif status == _SHORT:
            self.pending = [phys]
            self.pending_count, self.pending_chars = self._count(phys), len(phys.text)
        elif status == _VALUES and values is not None:
            self._bad_values(phys.number, phys.text, values)
        else:
            self._bad_count(phys.number, phys.text, status)

    def _count(self, phys: _Phys) -> int:
        if phys.count < 0:
            fmt = self.fmt
            assert fmt is not None
            phys.count = phys.text.count(fmt.delimiter) + 1
        return phys.count

    def _accept(self, number: int, text: str, values: list[str]) -> None:
        """Use a fitted record, holding it back one line when its last column may go on."""
        fmt = self.fmt
        assert fmt is not None
        if fmt.open_last:
            self.held = (number, text, values)
        else:
            self._row(number, values, text)

    def _continues_held(self, phys: _Phys) -> bool:
        """Append ``phys`` to the held record when it is the rest of its last value."""
        fmt = self.fmt
        assert fmt is not None
        if self.held is None or phys.skip or phys.clipped or fmt.delimiter in phys.text:
            return False
        first = fmt.checks[0] if fmt.checks and fmt.checks[0][0] == 0 else None
        if first is not None and first[1].fullmatch(phys.text.strip()):
            return False  # a record of its own, cut after its first field
        number, text, _ = self.held
        joined = text + "\n" + phys.text
        if len(joined) > MAX_RECORD_CHARS:
            return False
        status, values = self._fit(joined, strict=True)
        if status != _OK or values is None:
            return False
        self.held = (number, joined, values)
        return True

    def _flush_first(self) -> None:
        """Give up joining: the first pending line is malformed, the others are re-read."""
        first, rest = self.pending[0], self.pending[1:]
        self.pending = []
        self._bad_count(first.number, first.text, _SHORT)
        for phys in rest:
            self._process(phys)

    def _flush(self) -> None:
        while self.pending:
            self._flush_first()
        self._commit_held()

    def _commit_held(self) -> None:
        if self.held is not None:
            number, text, values = self.held
            self.held = None
            self._row(number, values, text)

    def _bad_count(self, number: int, text: str, status: str) -> None:
        fmt = self.fmt
        assert fmt is not None
        n = len(fmt.fields)
        parts = text.split(fmt.delimiter)
        found = len(parts) - (1 if fmt.trailing and len(parts) > 1 and parts[-1] == "" else 0)
        self.bad_counts[found] += 1
        if status == _SHORT:
            error = f"{found} fields where the format has {n} (row cut short?)"
        elif status == _AMBIGUOUS:
            error = (
                f"{found} fields where the format has {n}; the extra delimiters could belong "
                "to more than one free-text column"
            )
        else:
            error = f"{found} fields where the format has {n}"
        self._bad(number, text, error)

    def _bad_values(self, number: int, text: str, values: list[str]) -> None:
        columns = self._unfit_columns(values)
        self.bad_values += 1
        if not self.value_sample:
            self.value_sample = f"line {number}: {columns}"
        self._bad(number, text, f"values do not fit their columns: {columns}; row not used")

    def _bad(self, number: int, text: str, error: str) -> None:
        self.bad_rows += 1
        self.any_rows = True
        self._find("AUD008", number, text, error=error)
        if self.ok_rows == 0 and self.bad_rows >= REFUSE_AFTER:
            self._refuse()

    def _refuse(self) -> None:
        fmt = self.fmt
        assert fmt is not None
        n = len(fmt.fields)
        shape = f"{n} fields ({','.join(fmt.fields)}) split on {fmt.delimiter!r}"
        advice = "pass the --format (and --delimiter) the dump was captured with"
        counted = sum(self.bad_counts.values())
        if counted and counted >= self.bad_values:
            common = sorted(count for count, _ in self.bad_counts.most_common(3))
            found = " or ".join([", ".join(str(c) for c in common[:-1]), str(common[-1])]
                                if len(common) > 1 else [str(common[0])])
            plural = "" if common == [1] else "s"
            raise SacctFormatError(
                f"{self.path}: expected {shape} in each row, but the rows have {found} "
                f"field{plural}; {advice}"
            )
        raise SacctFormatError(
            f"{self.path}: rows have the {shape} but their values do not fit them "
            f"({self.value_sample}); {advice}"
        )

    # ---------------------------------------------------------------- findings

    def _find(self, rule_id: str, number: int, text: str, **values: object) -> None:
        if len(self.findings) >= MAX_FINDINGS:
            self.dropped += 1
            return
        quote = clip(text.replace("\n", "\\n"), 120)
        citation = Citation(self.path, line=number, quote=quote)
        self.findings.append(rules.finding(rule_id, self.path, (citation,), **values))


class _Prefixed:
    """``reader``'s bytes with its first chunk, read (and hashed) already, given back first:
    the chunks the line splitter sees are those it saw reading ``reader`` itself."""

    __slots__ = ("_head", "_reader")

    def __init__(self, head: bytes, reader: HashingReader | Transcoded) -> None:
        self._head: bytes | None = head
        self._reader = reader

    def read(self, size: int = CHUNK_SIZE) -> bytes:
        head, self._head = self._head, None
        return head if head else self._reader.read(size)


_QUOTES = ("'", '"')

_FITTING_KEPT = 1024
"""Values kept per column as known to pass its shape check."""


def _unquote(text: str, delimiter: str) -> str:
    """A row pasted from a Python repr without its quotes: the whole line quoted
    (``'1_3|5|...|None'``, a trailing ``\\n`` of the repr dropped) or each field
    (``'1_3'|'5'|...``); ``text`` itself when it is neither."""
    stripped = text.strip()
    quote = stripped[:1]
    if len(stripped) < 2 or quote not in _QUOTES or stripped[-1] != quote:
        return text
    inner = stripped[1:-1].replace(quote + delimiter + quote, delimiter)
    return inner[:-2] if inner.endswith("\\n") else inner
