"""The process-wide memory state an audit and its report set (the store's other half).

:func:`paused_gc` pauses the cyclic garbage collector while a result is built and written;
:func:`lean_heap` and :func:`release_free_memory` have glibc's C heap give back what the
outputs free (nothing off glibc). Signals are :mod:`auditor._signals`'s.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block.

    An audit builds millions of small records that hold no reference cycles and
    live until the report is written; each collection re-scans them (about 10% of
    the time of a many-file study, measured with ``gc.callbacks``; writing the report
    of the 144,003-file study took 16-18 s with the collector on, 13.6 s paused) yet
    can free nothing. Reference counting still frees everything as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


MMAP_THRESHOLD = 128 * 1024
"""Bytes from which the C library's ``malloc`` maps a block of its own, given back to the
system when freed (glibc's default, held fixed: see :func:`lean_heap`)."""
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number of the threshold (``malloc.h``)."""


@functools.cache
def _glibc() -> Any:
    """The C library, when it is glibc (whose ``mallopt`` and ``malloc_trim`` are called
    below); None anywhere else."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        os.confstr("CS_GNU_LIBC_VERSION")  # (musl has no such name: ValueError)
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except (ValueError, OSError, ImportError):
        return None


def lean_heap() -> bool:
    """Have this process give every large freed block back to the system: hold glibc's
    mmap threshold at its default of 128 KiB (the command does, once its readers are gone,
    before it writes the outputs: a reader forked with it paid a mapping and its page
    faults for each block it read a file into, 5-15% of a many-file audit). glibc raises the
    threshold each time a mapped block is freed, up to 32 MiB, so after the first record
    batches and Arrow buffers come and go, blocks of that size are carved from the heap,
    and what they leave when freed is kept for the process's life: at a million files
    that was 70-160 MB of the audit's peak, free but never returned. Whether it was set
    (False off glibc)."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``): between
    the outputs of a large audit, what one freed is then not held while the next is
    written. Nothing off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
