"""Text as the outputs and messages show it: clipped, counted, printable.

:func:`clip` and :func:`counted` shape what a finding or the report says; :func:`printable`
(and its inverse :func:`unprintable`, :func:`printable_json`) make text that came from file
names or files valid UTF-8 for the outputs, which cannot hold lone surrogates.
"""

from __future__ import annotations

import re
from typing import Any


def printable(text: str) -> str:
    """``text`` as valid UTF-8: a file name's undecodable byte (kept by the file system
    decoding as a lone surrogate, so the file can still be opened) becomes ``\\xNN``, any
    other lone surrogate ``\\uNNNN``. Outputs (Parquet, JSON, markdown, the terminal)
    cannot hold lone surrogates."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(
            f"\\x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff"
            else f"\\u{ord(ch):04x}" if "\ud800" <= ch <= "\udfff" else ch
            for ch in text)
    return text


def unprintable(text: str) -> str:
    """The file name :func:`printable` made ``text`` from (its ``\\xNN`` of 80-FF back to
    the bytes the file system decoding keeps as lone surrogates)."""
    if "\\x" not in text:
        return text
    return re.sub(r"\\x([89a-f][0-9a-f])", lambda m: chr(0xDC00 + int(m.group(1), 16)), text)


def printable_json(value: Any) -> Any:
    """``value`` (JSON-like) with every string :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_json(k): printable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_json(v) for v in value]
    if isinstance(value, tuple):
        return tuple(printable_json(v) for v in value)
    return value


def json_line(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **dumps)``, every text :func:`printable` when
    one is not UTF-8 (a command's argument, an environment value or a file name the system
    gave as bytes): what encodes to UTF-8 whatever the value held."""
    import json

    text = json.dumps(value, ensure_ascii=False, **dumps)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(printable_json(value), ensure_ascii=False, **dumps)
    return text


def counted(n: int, thing: str) -> str:
    """``n`` things, in the right number: ``1 trace``, ``1,400 findings``."""
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def clip(text: str, limit: int = 200) -> str:
    """Clip ``text`` to ``limit`` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
