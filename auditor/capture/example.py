"""An example trainer using the producer kit, CPU only (no torch needed).

``python -m auditor.capture.example --mode M [ATTEMPT_DIR]`` (the directory defaults to the
one ``auditor run`` exports) starts a driver that starts one rank process per GPU ``auditor run
--gpus`` gave (``AUDITOR_GPUS``; two outside it). Each rank
writes its allocator trace (:class:`~auditor.capture.Trace`: ``init_model``,
``rollout_init``, then per step ``rollout_generate``, ``actor_update``, ``weight_sync``) and
its device file; the driver prints verl-style console lines, ``step:N -
training/global_step:N - ...``, for ``TOTAL_TRAINING_STEPS`` steps (default 1). It uses no
GPU: every memory figure is ``null`` ("not measured"), every device file has ``"gpu": null``,
and torch, if installed, is not imported (a dozen elements starting at once on a small node
waited tens of seconds for it: the real-Slurm kit array's pre-timeout element was signalled
before its ranks had written a line).

Modes, one per way a run ends:

- ``completed``: every phase and step line; exit 0;
- ``oom``: rank 0's ``rollout_init`` raises an out-of-memory error named as torch's
  (``torch.OutOfMemoryError``, an eligible failure under the default protocol); exit 1;
- ``coordinated``: completes, then the driver, standing for cosmos' controller, SIGTERMs
  itself as ``COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS`` makes it do (it does so whatever the
  flag says: whether that 143 is a success is the wrapper's and the audit's question);
- ``crash``: rank 1's step-1 ``actor_update`` raises ``RuntimeError``; exit 1;
- ``hang``: the ranks stop in step 1's ``rollout_generate`` and wait until killed.

This module is a program: it writes its console lines to stdout.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from auditor.capture._files import ATTEMPT_DIR_VARIABLE, GPUS_VARIABLE
from auditor.capture.device import write_device_evidence
from auditor.capture.memory import Memory
from auditor.capture.trace import Trace

MODES = ("completed", "oom", "coordinated", "crash", "hang")
RANKS = 2
MAX_RANKS = 8
PHASE_SECONDS = 0.02


class OutOfMemoryError(RuntimeError):
    """Stands for ``torch.OutOfMemoryError`` (the example has no torch): its qualified name
    in the trace is the same, so the audit reads it as the real one."""


OutOfMemoryError.__module__ = "torch"


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _steps() -> int:
    value = os.environ.get("TOTAL_TRAINING_STEPS", "1").strip().strip('"')
    return int(value) if value.isdigit() and int(value) > 0 else 1


def _rank(mode: str, attempt_dir: Path, rank: int) -> int:
    """One rank process: its trace, its device file, its phases."""
    prefix = f"(WorkerDict pid={os.getpid()}) "
    with Trace(attempt_dir, rank, memory=Memory(probe=False)) as trace:
        write_device_evidence(attempt_dir, rank, local_device=rank, trace=trace)
        try:
            with trace.phase("init_model", 0):
                time.sleep(PHASE_SECONDS)
            with trace.phase("rollout_init", 0):
                time.sleep(PHASE_SECONDS)
                if mode == "oom" and rank == 0:
                    raise OutOfMemoryError(
                        "CUDA out of memory. Tried to allocate 2.00 GiB (simulated by the "
                        "auditor example: no GPU was used)")
            trace.sample()
            for step in range(1, _steps() + 1):
                with trace.phase("rollout_generate", step):
                    time.sleep(PHASE_SECONDS)
                    if mode == "hang":
                        _say(prefix + f"rank {rank} waiting for rollout workers")
                        while True:
                            time.sleep(1)
                with trace.phase("actor_update", step):
                    time.sleep(PHASE_SECONDS)
                    if mode == "crash" and rank == 1:
                        raise RuntimeError("example crash in actor_update")
                with trace.phase("weight_sync", step):
                    time.sleep(PHASE_SECONDS)
        except Exception:  # noqa: BLE001 - a rank reports its error as a worker would
            for line in traceback.format_exc().splitlines():
                _say(prefix + line)
            return 1
        finally:
            write_device_evidence(attempt_dir, rank, local_device=rank, trace=trace)
    return 0


def _rank_count() -> int:
    """One rank per GPU ``auditor run --gpus`` gave (``AUDITOR_GPUS``, at most
    :data:`MAX_RANKS`); :data:`RANKS` outside it."""
    given = os.environ.get(GPUS_VARIABLE, "").strip()
    return min(int(given), MAX_RANKS) if given.isdigit() and int(given) > 0 else RANKS


def _driver(mode: str, attempt_dir: Path) -> int:
    """Start the ranks, wait for them, print the step lines; end as ``mode`` says."""
    prefix = f"(TaskRunner pid={os.getpid()}) "
    steps, count = _steps(), _rank_count()
    _say(prefix + f"example trainer: mode {mode}, {count} ranks, {steps} step(s), "
         f"evidence in {attempt_dir}")
    ranks = [subprocess.Popen([sys.executable, "-m", "auditor.capture.example", "--mode", mode,
                               "--rank", str(rank), str(attempt_dir)],
                              env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)})
             for rank in range(count)]
    codes = [process.wait() for process in ranks]
    if any(codes):
        _say(prefix + "Error executing job: a worker failed "
             f"(exit codes {', '.join(map(str, codes))})")
        return 1
    for step in range(1, steps + 1):
        _say(prefix + f"step:{step} - training/global_step:{step} - training/epoch:0 - "
             f"actor/loss:{0.5 / step:.3f} - timing_s/step:{3 * PHASE_SECONDS * count:.3f}")
    if mode == "coordinated":
        _say(prefix + "Coordinated shutdown: no policy replicas remain; the controller sends "
             "itself SIGTERM")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # (the default action ends the process first)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The example's command line."""
    parser = argparse.ArgumentParser(prog="python -m auditor.capture.example",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mode", choices=MODES, default="completed")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("attempt_dir", nargs="?", type=Path,
                        help=f"the attempt directory (default: ${ATTEMPT_DIR_VARIABLE})")
    args = parser.parse_args(argv)
    attempt_dir = args.attempt_dir or (Path(os.environ[ATTEMPT_DIR_VARIABLE])
                                       if os.environ.get(ATTEMPT_DIR_VARIABLE) else None)
    if attempt_dir is None:
        parser.error(f"no ATTEMPT_DIR given and ${ATTEMPT_DIR_VARIABLE} is not set")
    if args.rank is not None:
        return _rank(args.mode, attempt_dir, args.rank)
    return _driver(args.mode, attempt_dir)


if __name__ == "__main__":
    sys.exit(main())
