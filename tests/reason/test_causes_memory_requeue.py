"""Two causes the contract's v1.2 "More causes" corrects (issue 43, item 1, in part): Python's
``MemoryError`` (and numpy's ``_ArrayMemoryError``, its subclass) is the host's memory,
``host_oom``, never a bare ``python_exception`` (torch's ``OutOfMemoryError`` stays the
GPU's); Slurm's ``CANCELLED ... DUE TO JOB REQUEUE`` is a requeue, ``preempted``, never a
person's cancellation."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from auditor._cli import main

REQUEUED = ("slurmstepd: error: *** JOB 31182239 ON sh-06-34 CANCELLED AT 2018-11-05T10:35:06 "
            "DUE TO JOB REQUEUE ***")
"""A real line (a public Slurm guide on SIGUSR1 requeueing, Stanford's Sherlock cluster), as
slurmstepd's ``_handle_signal_container`` prints ``"*** %s ON %s CANCELLED AT %s DUE TO JOB
REQUEUE ***"`` (slurm src/slurmd/slurmstepd/req.c)."""


def _cause(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> str | None:
    log = tmp_path / "t.log"
    log.write_text(text)
    capsys.readouterr()
    assert main(["causes", str(log), "--json"]) == 0
    cause = orjson.loads(capsys.readouterr().out)["cause"]
    return None if cause is None else str(cause["cause"])


@pytest.mark.parametrize(("text", "word"), [
    ("Traceback (most recent call last):\n  File \"train.py\", line 10, in <module>\n"
     "    buffer = bytearray(1 << 40)\nMemoryError\n", "host_oom"),
    ("Traceback (most recent call last):\n  File \"prep.py\", line 3, in <module>\n"
     "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB for an array "
     "with shape (1000000000,) and data type float64\n", "host_oom"),
    ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", "gpu_oom"),
    ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
     "ValueError: MemoryError is not what this is\n", "python_exception"),
    (REQUEUED + "\n", "preempted"),
    ("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2024-05-01T10:00:00 ***\n",
     "cancelled"),
])
def test_memory_errors_and_requeues(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    text: str, word: str) -> None:
    assert _cause(tmp_path, capsys, text) == word


RAY_WORKER_DEATH = (
    "(raylet) A worker died or was killed while executing a task by an unexpected system "
    "error. To troubleshoot the problem, check the logs for the dead worker. RayTask ID: "
    "ffffffffffffffff Worker ID: 60f8d143462b96cd3bf4270eafe617aaf2d2ca7266cb Node ID: "
    "4cb25bc084aeb5a31ca5402ad589ae042a71165a8e2dd8418fecee26 Worker IP address: "
    "10.0.50.112 Worker port: 10015 Worker PID: 2938 Worker exit type: SYSTEM_ERROR Worker "
    "exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
    "Some common causes include: (1) the process was killed by the OOM killer due to high "
    "memory usage, (2) ray stop --force was called, or (3) the worker crashed unexpectedly "
    "due to SIGSEGV or another unexpected error.")
"""Ray's worker-death text as its documentation shows it (ray docs, "Debugging Failures",
from ``node_manager.cc``'s ``HandleClientConnectionError``): "SIGSEGV" and "the OOM killer"
are among what *might* have happened, never evidence (contract v1.2)."""


def test_hedged_text_is_never_evidence(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """It was named ``segfault``; the worker's death is what the line says happened."""
    assert _cause(tmp_path, capsys, RAY_WORKER_DEATH + "\n") == "actor_died"
    assert _cause(tmp_path, capsys, "Fatal Python error: Segmentation fault\n") == "segfault"


def test_a_signal_torchruns_agent_received_is_named_as_received(
        capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun's ``Received 15 death signal, shutting down workers``: the agent received
    SIGTERM (and passed it on); the log does not say who sent it. It was said to come
    *from* the agent."""
    log = Path(__file__).parents[2] / "fixtures" / "causes" / \
        "signal__prime-rl-issue1360-received-15-death-signal.log"
    capsys.readouterr()
    assert main(["causes", str(log), "--json"]) == 0
    cause = orjson.loads(capsys.readouterr().out)["cause"]
    assert cause["cause"] == "signal"
    assert "received by torchrun's elastic agent" in cause["detail"]
    assert "from torchrun" not in cause["detail"]
