"""Read one small JSON document (period, trial, device, protocol) safely, and typed field access.

:func:`load_json` turns any bytes into either a JSON object or findings, never
an exception: an empty file (``AUD010``), a file over the size limit
(``AUD012``, hashed but not parsed), bytes that are not strict JSON (``AUD001``:
invalid UTF-8, a BOM, ``NaN``/``Infinity``, nesting deeper than orjson's 1024
levels, trailing data), an object with a duplicate key (``AUD001``: which value
counts is parser-dependent, so the document is ambiguous evidence and is not
used), and a top-level value that is not an object (``AUD002`` at ``#``).

The typed getters (:func:`as_int` ...) return None for a value of the wrong
type; the schema finding for it comes from :func:`auditor.schema.validate_document`,
so a collector reads fields and the schema explains, and the two agree because
both treat only a Python ``int`` (never ``bool``, never ``1.0``) as an integer.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, BinaryIO

import orjson

from auditor import rules
from auditor._io import HashingReader, read_limited
from auditor._text import clip
from auditor.model import INT64_MAX, INT64_MIN, Citation, FileDigest, Finding
from auditor.model.kinds import DOCUMENT_LIMIT
from auditor.schema import json_type, pointer_of

DEFAULT_LIMIT = DOCUMENT_LIMIT
"""Largest JSON document parsed (bytes); evidence documents are a few kilobytes."""


class _CountingReader:
    """Counts the bytes read through it, so a too-large file can report its size."""

    def __init__(self, raw: BinaryIO | HashingReader) -> None:
        self._raw = raw
        self.total = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.total += len(data)
        return data


class _DuplicateKeys(dict[str, Any]):
    """An object that had a repeated key in its source text."""

    __slots__ = ("duplicates",)

    duplicates: list[str]


def load_json(
    stream: BinaryIO | HashingReader,
    path: str,
    limit: int = DEFAULT_LIMIT,
    *,
    kind: str = "JSON document",
) -> tuple[dict[str, Any] | None, list[Finding]]:
    """Parse the JSON object in ``stream`` (cited as ``path``).

    Returns the object, or None with the findings saying why not. Reads (and
    so hashes) the whole stream whatever its bytes. An ``OSError`` from the
    stream is not about the bytes and propagates: the caller reports the file
    as unreadable (``AUD104``).
    """
    counter = _CountingReader(stream)
    data = read_limited(counter, limit)  # type: ignore[arg-type]
    if data is None:
        return None, [
            rules.finding(
                "AUD012", path, [Citation(path)], size=counter.total, limit=limit, kind=kind
            )
        ]
    if not data:
        return None, [rules.finding("AUD010", path, [Citation(path)])]
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        return None, [_invalid(path, str(error), data, error.lineno, error.pos)]
    duplicates = _duplicate_keys(data) if has_duplicate_keys(data, doc) else []
    if duplicates is None:
        return None, [_invalid(path, "nesting too deep to check for duplicate keys")]
    if duplicates:
        pointer, key = duplicates[0]
        more = f" (and {len(duplicates) - 1} more)" if len(duplicates) > 1 else ""
        return None, [
            rules.finding(
                "AUD001",
                path,
                [Citation(path, pointer=pointer, quote=clip(key, 80))],
                error=f"duplicate key {json.dumps(key)} in the object at #{pointer}{more}; "
                "which value counts is ambiguous",
            )
        ]
    if not isinstance(doc, dict):
        return None, [
            rules.finding(
                "AUD002",
                path,
                [Citation(path, pointer="", quote=clip(data[:80].decode("utf-8", "replace")))],
                where="#",
                error=f"expected an object, found {json_type(doc)}",
            )
        ]
    return doc, []


def _invalid(
    path: str, error: str, data: bytes = b"", line: int | None = None, pos: int | None = None
) -> Finding:
    quote = ""
    if data and pos is not None:
        quote = data[max(0, pos - 30) : pos + 30].decode("utf-8", "replace")
    return rules.finding(
        "AUD001", path, [Citation(path, line=line, quote=clip(quote, 80))], error=clip(error, 200)
    )


def has_duplicate_keys(data: bytes, doc: object) -> bool:
    """Whether the text ``data`` (parsed into ``doc``) repeats a key in some object.

    Fast way, for text without a ``\\u`` escape: outside strings JSON has one colon per
    key, and inside them the same colons as the parsed strings (only a ``\\u003a`` could
    spell one otherwise: the other escapes are of quotes, backslashes, slashes and control
    characters), so the text holds exactly as many colons as ``doc`` written back, unless
    a repeated key (at least its colon) was dropped by the parser. Otherwise (``\\u``
    escapes, or nesting orjson will not write back) the keys are counted token by token.
    (A trial record's ``dispatch`` holds escaped quotes: the token count took 20 us.)
    """
    if b"\\u" not in data:
        try:
            return data.count(b":") != orjson.dumps(doc).count(b":")
        except orjson.JSONEncodeError:
            pass
    return _key_count(doc) != _key_tokens(data)


_STRING_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"\s*(:?)')
"""A JSON string token, and the colon that makes it a key. Outside strings JSON has no
quote, and each match consumes a whole string, so matches stay aligned to tokens. (Runs
of plain characters are taken at once: an alternation per character ran 2.5x slower.)"""


def _key_tokens(data: bytes) -> int:
    """How many object keys the text spells out (repeats included)."""
    return _STRING_TOKEN.findall(data).count(b":")


def _key_count(doc: object) -> int:
    """How many keys the parsed document kept (a repeated key is kept once)."""
    total = 0
    stack = [doc]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            total += len(node)  # type: ignore[arg-type]
            stack.extend(v for v in node.values() if type(v) in (dict, list))  # type: ignore[attr-defined]
        elif kind is list:
            stack.extend(v for v in node if type(v) in (dict, list))  # type: ignore[attr-defined]
    return total


def _duplicate_keys(data: bytes) -> list[tuple[str, str]] | None:
    """(JSON pointer of the object, key) for every repeated key; None when too deep to check.

    orjson silently keeps the last value of a repeated key; the standard
    library's parser exposes the pairs, so it is used for this one check.
    """
    flagged = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal flagged
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        flagged = True
        marked = _DuplicateKeys(obj)
        seen: set[str] = set()
        marked.duplicates = []
        for key, _ in pairs:
            if key in seen:
                marked.duplicates.append(key)
            seen.add(key)
        return marked

    try:
        tree = json.loads(data, object_pairs_hook=hook)
    except RecursionError:
        return None
    except ValueError:  # cannot happen after orjson accepted the bytes; be safe anyway
        return []
    if not flagged:
        return []
    found: list[tuple[str, str]] = []
    stack: list[tuple[object, tuple[object, ...]]] = [(tree, ())]
    while stack:
        node, parts = stack.pop()
        if isinstance(node, _DuplicateKeys):
            found.extend((pointer_of(parts), key) for key in node.duplicates)
        if isinstance(node, dict):
            stack.extend((value, (*parts, key)) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, (*parts, index)) for index, value in enumerate(node))
    found.sort()
    return found


def finish(stream: BinaryIO | HashingReader) -> FileDigest | None:
    """Hash any unread bytes and return the digest, when ``stream`` is a :class:`HashingReader`."""
    if isinstance(stream, HashingReader):
        stream.drain()
        return stream.digest()
    return None




def as_int(value: object) -> int | None:
    """``value`` when it is a JSON integer (not a boolean, not ``1.0``) a signed 64-bit
    integer holds, else None (the schema's finding names a larger one: past 64 bits no
    table holds it, and one once crashed the audit where the tables were written)."""
    return value if type(value) is int and INT64_MIN <= value <= INT64_MAX else None


SHARED_STR_LIMIT = 40
"""Strings up to this long (names, kinds, hosts, GPU models) are kept once per process."""


def as_str(value: object) -> str | None:
    """``value`` when it is a string, else None. A short one is interned: a study repeats
    the same role, kind, host and GPU names in thousands of records."""
    if type(value) is not str:
        return None
    return sys.intern(value) if len(value) <= SHARED_STR_LIMIT else value


def as_bool(value: object) -> bool | None:
    """``value`` when it is a boolean, else None."""
    return value if type(value) is bool else None


def as_obj(value: object) -> dict[str, Any]:
    """``value`` when it is an object, else an empty one."""
    return value if type(value) is dict else {}


def as_list(value: object) -> list[Any]:
    """``value`` when it is an array, else an empty one."""
    return value if type(value) is list else []


def as_job_id(value: object) -> str | None:
    """A job id: a string as written; an integer (flagged by the schema) as its digits."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    return None


def as_text(value: object) -> str:
    """A string as written, anything else as its JSON text (for dispatch/env values)."""
    if type(value) is str:
        return value
    try:
        return orjson.dumps(value).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)
