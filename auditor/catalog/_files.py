"""Reading an audit's own files: a regular file's bytes, never a FIFO's wait."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def regular_bytes(path: Path, read: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (links followed; none unless ``read``);
    anything else is an ``OSError`` saying what it is: a FIFO put in its place would block
    the read for ever, a device never end it."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO: opened, not waited)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(os.dup(descriptor), "rb") as handle:
            return handle.read() if read else b""
    finally:
        os.close(descriptor)
