"""The C heap of the command's process: large freed blocks go back to the system
(:func:`auditor._memory.lean_heap`), and so do the free pages between outputs
(:func:`auditor._memory.release_free_memory`). Each is watched in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from auditor._cli import main
from tests.helpers import EXAMPLE

GLIBC = sys.platform.startswith("linux") and bool(
    os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else "")
needs_glibc = pytest.mark.skipif(not GLIBC, reason="glibc's mallopt and malloc_trim")

MAPPED = """
import ctypes, sys
from auditor._memory import lean_heap

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    ).split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "lean":
    assert lean_heap()
before = libc.mallinfo2().hblkhd
big = bytearray(8 << 20)  # mapped; freed, it raises glibc's own threshold to 8 MiB
print((libc.mallinfo2().hblkhd - before) >> 20)
del big
blocks = [bytearray(1 << 20) for _ in range(6)]
print((libc.mallinfo2().hblkhd - before) >> 20)
"""

TRIMMED = """
import sys
from auditor._memory import release_free_memory

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 >> 20

blocks = [bytearray(100_000) for _ in range(2000)]  # below the threshold: the heap's
kept = blocks[-1]  # (the heap's top stays in use: nothing is given back at the top)
del blocks
before = rss()
if sys.argv[1] == "release":
    release_free_memory()
print(before, rss())
"""


def _run(script: str, *args: str) -> list[int]:
    """What ``script`` prints, run under glibc's own malloc settings: any ``MALLOC_*_``
    variable turns its dynamic threshold off (Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``
    in the environment of the process that starts a local cluster, as another test here
    does in the same worker)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("MALLOC_") and name != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, check=True, timeout=60, env=env)
    return [int(word) for word in done.stdout.split()]


@needs_glibc
def test_large_blocks_stay_mapped_after_a_larger_one_is_freed() -> None:
    """glibc raises its mmap threshold to the size of each mapped block freed, so later
    blocks of a MiB come from the heap and what they leave is kept; held at 128 KiB, they
    stay mapped, each given back to the system when freed."""
    assert _run(MAPPED, "lean") == [8, 6]
    assert _run(MAPPED, "default") == [8, 0]  # (glibc's own threshold, raised to 8 MiB)


@needs_glibc
def test_free_pages_inside_the_heap_go_back_when_released() -> None:
    """200 MB freed below the heap's top stays resident until it is released."""
    before, after = _run(TRIMMED, "release")
    assert before > 150 and after < before - 150
    before, after = _run(TRIMMED, "keep")
    assert before > 150 and after > before - 10


def test_the_command_keeps_a_lean_heap_while_it_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's own process holds the threshold once the reading is done, before it
    writes the outputs (held from the start, the forked readers paid for it: a sixth of
    a many-file audit); a caller of ``main`` keeps its process's own."""
    out = tmp_path / "out"
    script = ("import sys, auditor._cli as cli\n"
              "from auditor.model import Progress\n"
              "seen = []\n"
              "cli.lean_heap = lambda: print('lean after', seen[-1:]) or True\n"
              "cli._progress_lines = lambda: (lambda event: seen.append(event.stage))\n"
              f"sys.argv = ['auditor', 'audit', {str(EXAMPLE)!r}, '--out', {str(out)!r},"
              " '--no-plots']\n"
              "cli.entry()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "lean after ['write']"
    import auditor._cli as cli

    asked: list[int] = []

    def lean() -> bool:
        asked.append(1)
        return True

    monkeypatch.setattr(cli, "lean_heap", lean)
    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "again"), "--quiet",
                 "--no-plots"]) == 0
    assert asked == []


def test_each_output_written_gives_its_free_memory_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the outputs and between them the heap's free pages are released: what the
    reading freed is not held while they are written, nor what the periods table freed
    while the report is."""
    import auditor.report.output as output

    released: list[int] = []
    monkeypatch.setattr(output, "release_free_memory", lambda: released.append(1))
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    written = [path for path in out.rglob("*") if path.is_file()]
    # (before the first, and after each but the output manifest, made last)
    assert len(released) == 1 + len(written) - 1
