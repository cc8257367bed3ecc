"""A dump saved as UTF-16 or UTF-32: read through its byte-order mark, as the UTF-8 sacct wrote.

sacct writes UTF-8. A dump redirected by PowerShell 5's ``>`` (``Out-File``), or saved as
"Unicode" by a Windows editor, is UTF-16 LE (sometimes BE) with a byte-order mark at byte
0: read as UTF-8, every line held NUL bytes and its first was misread (an AUD006 a line,
the first row lost). :func:`byte_order` names such a file from its first bytes, and
:class:`Transcoded` gives its text back as UTF-8, chunk by chunk (bounded memory), to the
same readers; a byte sequence that does not decode refuses the whole dump
(:class:`~auditor.errors.SacctFormatError`): what was read so far is never used as if it
were all. A file without a byte-order mark is read as UTF-8, as before (a stray NUL is one
line's AUD006).
"""

from __future__ import annotations

import codecs
from typing import NamedTuple, NoReturn

from auditor import rules
from auditor._io import CHUNK_SIZE, HashingReader
from auditor._text import clip
from auditor.collect.sacct.format import CAPTURE_HINT
from auditor.errors import SacctFormatError
from auditor.model import Citation, Finding


class ByteOrder(NamedTuple):
    """A byte-order mark: its bytes, the codec that reads what follows, its names."""

    mark: bytes
    codec: str
    """Python's codec of the text after the mark (its endianness explicit)."""
    name: str
    """As messages name it (``UTF-16 LE``)."""
    iconv: str
    """As ``iconv -f`` takes it (reads the mark itself, either endianness)."""


_MARKS = (  # (UTF-32 LE's mark begins with UTF-16 LE's: the longer ones are tried first)
    ByteOrder(b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32 LE", "UTF-32"),
    ByteOrder(b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32 BE", "UTF-32"),
    ByteOrder(b"\xff\xfe", "utf-16-le", "UTF-16 LE", "UTF-16"),
    ByteOrder(b"\xfe\xff", "utf-16-be", "UTF-16 BE", "UTF-16"),
)


def byte_order(head: bytes) -> ByteOrder | None:
    """The UTF-16/UTF-32 byte-order mark ``head`` (a dump's first bytes) opens with, or None."""
    return next((mark for mark in _MARKS if head.startswith(mark.mark)), None)


def encoding_finding(path: str, mark: ByteOrder) -> Finding:
    """The one ``AUD026`` of a dump read through ``mark``: it names the file and encoding."""
    return rules.finding("AUD026", path, (Citation(path, line=1),),
                         encoding=mark.name, codec=mark.iconv)


class Transcoded:
    """The text of ``reader`` (its first chunk, ``head``, read and hashed already) after
    ``mark``, decoded strictly and given back as UTF-8 bytes: what a parser of sacct's own
    output reads. Every byte is still read, and hashed, through ``reader``."""

    __slots__ = ("_decoder", "_done", "_fed", "_head", "_mark", "_path", "_reader")

    def __init__(self, head: bytes, reader: HashingReader, mark: ByteOrder, path: str) -> None:
        self._head: bytes | None = head[len(mark.mark):]
        self._reader = reader
        self._mark = mark
        self._path = path
        self._decoder = codecs.getincrementaldecoder(mark.codec)("strict")
        self._fed = len(mark.mark)
        """Bytes of the file given to the decoder so far (the mark counted)."""
        self._done = False

    def read(self, size: int = CHUNK_SIZE) -> bytes:
        """Up to about ``size`` bytes' worth of the file, as UTF-8 (``b""`` at its end)."""
        while not self._done:
            head, self._head = self._head, None
            raw = head if head is not None else self._reader.read(max(size, 4))
            final = not raw and head is None
            held = len(self._decoder.getstate()[0])  # (a character cut by the chunk's end)
            try:
                text = self._decoder.decode(raw, final=final)
            except UnicodeDecodeError as error:
                self._done = True
                self._refuse(self._fed - held + error.start, error.reason)
            self._fed += len(raw)
            self._done = final
            if text:
                return text.encode("utf-8")
        return b""

    def drain(self) -> None:
        """Hash the rest of the file, unread (a reader that stops early calls it)."""
        self._done = True
        self._reader.drain()

    def _refuse(self, offset: int, why: str) -> NoReturn:
        mark = self._mark
        raise SacctFormatError(
            f"{self._path}: {mark.name} (a byte-order mark at byte 0) that does not decode as "
            f"{mark.name} at byte {offset:,} ({clip(why, 80)}): cut short or altered, it is "
            f"not read; capture it again, its output redirected by a POSIX shell: {CAPTURE_HINT}"
        )

