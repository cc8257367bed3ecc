"""The guardian of a wrapped command: what ends the command's processes if the wrapper is
killed (a SIGKILL runs no handler of the wrapper's).

A few lines of Python (:data:`GUARDIAN`) in a session of their own, ignoring the termination
signals a group or a terminal sends, wait on a pipe whose other end only the wrapper holds.
The wrapper writes the command's process group first, then each process of the command's its
looks find (pid and start time); "done" when the command is over and the wrapper alive. When
the pipe closes without "done", the guardian SIGKILLs the group, every process carrying the
run's :data:`RUN_TOKEN` in its environment, every process the wrapper told it of (its start
time unchanged: not a pid reused since) and their children, until none is left.
"""

from __future__ import annotations

import subprocess
import sys

RUN_TOKEN = "AUDITOR_RUN_TOKEN"
"""Set in the command's environment, one value per run: how the guardian knows the
command's processes once the wrapper is gone (the process tree is broken by then)."""
GUARDIAN = r"""
import os, signal, sys, time
for number in (1, 2, 3, 10, 12, 13, 15):  # (HUP, INT, QUIT, USR1, USR2, PIPE, TERM)
    signal.signal(number, signal.SIG_IGN)
said = b""
while True:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    said += chunk
lines = said.split(b"\n")
if b"done" in lines:
    sys.exit(0)
group = int(lines[0]) if lines[0].isdigit() else 0
marker = b"%s=%s" % (sys.argv[1].encode(), sys.argv[2].encode())
seen = {}  # (pid -> its start time: a pid the wrapper saw, never one reused since)
for line in lines[1:]:
    pair = line.split()
    if len(pair) == 2 and pair[0].isdigit() and pair[1].isdigit():
        seen[int(pair[0])] = pair[1]
if group > 0:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
for _ in range(100):
    table = {}  # (pid -> state, parent, group, start time)
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/stat" % name, "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
                table[int(name)] = (fields[0], int(fields[1]), int(fields[2]), fields[19])
            except (OSError, IndexError, ValueError):
                continue
    hit = 0
    for pid, (state, parent, pgrp, started) in table.items():
        if state == b"Z":  # (dead: its adopter reaps it)
            continue
        found = pgrp == group or seen.get(pid) == started or (
            parent in seen and parent in table and table[parent][3] == seen[parent])
        if not found:
            try:
                with open("/proc/%d/environ" % pid, "rb") as handle:
                    found = marker in handle.read().split(b"\0")
            except OSError:
                continue
        if found:
            seen[pid] = started  # (its children are found by their parent)
            try:
                os.kill(pid, signal.SIGKILL)
                hit += 1
            except OSError:
                pass
    if not hit:
        break
    time.sleep(0.05)
"""
"""The guardian's program (``python -I -S -c``: nothing of the wrapper's imported)."""


def start_guardian(token: str) -> subprocess.Popen[bytes] | None:
    """Start the guardian of a run whose command will carry ``token`` (None where it cannot
    start: the run goes on, with the death signal alone)."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", GUARDIAN, RUN_TOKEN, token],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                # (a session of its own: a signal to the wrapper's group or
                                # terminal, a Ctrl-\ ending the wrapper, never reaches it)
                                start_new_session=True)
    except OSError:
        return None
