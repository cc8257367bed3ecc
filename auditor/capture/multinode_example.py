"""A multi-node example trainer: the processes of a cosmos-shaped launcher, CPU only.

``python -m auditor.capture.multinode_example ROLE [--mode M] [--rank R] RENDEZVOUS``, each
started by a launcher (``examples/multinode/launcher.sh``: seed ``000``'s two-node template)
with ``srun`` on its own node, under ``auditor run --step ROLE``:

- ``controller``: waits until a policy replica registers, then until none is left (a replica
  unregisters when it finishes, or is dropped when its heartbeat stops for
  :data:`HEARTBEAT_LOST_S`), prints the coordinated-shutdown line and SIGTERMs itself, as
  ``COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS`` makes cosmos' controller do (whatever the flag
  says: whether that 143 is a success is the kit's and the audit's question);
- ``policy``: registers, heartbeats, runs ``init_model``, then ``actor_update`` and
  ``weight_sync`` per step (each a phase of its allocator trace,
  :class:`auditor.capture.Trace`), prints verl's console line for each step, records its
  terminal record (``Trace.terminal``), writes its device file, unregisters and exits 0.
  Modes: ``crash`` (``actor_update`` raises ``RuntimeError``), ``oom`` (it raises an error
  named ``torch.OutOfMemoryError``), ``hang`` (it waits in step 1's ``actor_update`` until
  killed);
- ``rollout``: runs ``rollout_init``, then ``rollout_generate`` and ``weight_sync`` per
  step, then keeps draining until the launcher stops it.

Every role takes SIGUSR1 (the pre-timeout warning) as a request to checkpoint and goes on.
No GPU is used: the traces' memory figures are null (not measured), and torch, if installed,
is not imported (two dozen replicas starting at once on a small node would wait seconds for
it).
The rendezvous is a directory every node sees (a shared file system). This module is a
program: it writes its console lines to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from auditor.capture import Trace, write_device_evidence
from auditor.capture.memory import Memory

HEARTBEAT_S = 0.2
HEARTBEAT_LOST_S = 4.0
"""Seconds without a heartbeat after which the controller drops a replica (generous: a busy
node may not schedule a replica for a while)."""
PHASE_S = 0.05


class OutOfMemoryError(RuntimeError):
    """Stands for ``torch.OutOfMemoryError`` (no torch here): the same qualified name."""


OutOfMemoryError.__module__ = "torch"


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def steps() -> int:
    value = os.environ.get("TOTAL_TRAINING_STEPS", "1").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def controller(rendezvous: Path) -> int:
    say(f"[controller] pid {os.getpid()} on {os.uname().nodename}: waiting for policy replicas")
    while True:  # (a replica that registered and unregistered before this started counts)
        now = time.time()
        registered = list(rendezvous.glob("policy-*"))
        live = [p for p in registered if p.suffix != ".done"
                and now - _mtime(p, now) < HEARTBEAT_LOST_S]
        if registered and not live:
            break
        time.sleep(0.1)
    say("[controller] Coordinated shutdown: no policy replicas remain; the controller sends "
        "itself SIGTERM")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
    return 0


def _mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # (renamed meanwhile: unregistered)
        return default - HEARTBEAT_LOST_S


def _heartbeat(path: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        with contextlib.suppress(OSError):
            path.touch()


def policy(rendezvous: Path, mode: str, rank: int) -> int:
    registration = rendezvous / f"policy-{rank}"
    registration.touch()
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(registration, stop), daemon=True).start()
    prefix = f"(PolicyReplica pid={os.getpid()}) "
    with Trace(rank=rank, role="policy", memory=Memory(probe=False)) as trace:
        write_device_evidence(rank=rank, role="policy", local_device=0, trace=trace)
        try:
            with trace.phase("init_model", 0):
                time.sleep(PHASE_S)
            for step in range(1, steps() + 1):
                with trace.phase("actor_update", step):
                    time.sleep(PHASE_S)
                    if mode == "crash":
                        raise RuntimeError("policy replica crashed in actor_update")
                    if mode == "oom":
                        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                               "(simulated: no GPU was used)")
                    if mode == "hang":
                        say(prefix + "waiting in actor_update")
                        while True:
                            time.sleep(1)
                with trace.phase("weight_sync", step):
                    time.sleep(PHASE_S)
                say(prefix + f"step:{step} - training/global_step:{step} - actor/loss:0.5")
            trace.terminal(steps())  # (its own, fsynced: no log forwarding can lose it)
        except Exception:  # noqa: BLE001 - a replica reports its error as cosmos' would
            for line in traceback.format_exc().splitlines():
                say(prefix + line)
            return 1
        finally:
            write_device_evidence(rank=rank, role="policy", local_device=0, trace=trace)
    stop.set()
    registration.rename(registration.with_suffix(".done"))  # (unregisters)
    say(prefix + "unregistered")
    return 0


def rollout(rank: int) -> int:
    prefix = f"(RolloutReplica pid={os.getpid()}) "
    with Trace(rank=rank, role="rollout", memory=Memory(probe=False)) as trace:
        write_device_evidence(rank=rank, role="rollout", local_device=0, trace=trace)
        with trace.phase("rollout_init", 0):
            time.sleep(PHASE_S)
        for step in range(1, steps() + 1):
            with trace.phase("rollout_generate", step):
                time.sleep(PHASE_S)
            with trace.phase("weight_sync", step):
                time.sleep(PHASE_S)
        write_device_evidence(rank=rank, role="rollout", local_device=0, trace=trace)
    say(prefix + "draining")
    while True:  # (until the launcher reaps it)
        time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("controller", "policy", "rollout"))
    parser.add_argument("--mode", default="completed")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("rendezvous", type=Path)
    args = parser.parse_args()
    args.rendezvous.mkdir(parents=True, exist_ok=True)
    # the pre-timeout warning: a trainer checkpoints and goes on until the scheduler's SIGTERM
    signal.signal(signal.SIGUSR1, lambda *_: say(f"[{args.role}] SIGUSR1: checkpointing"))
    if args.role == "controller":
        return controller(args.rendezvous)
    if args.role == "policy":
        return policy(args.rendezvous, args.mode, args.rank)
    return rollout(args.rank)


if __name__ == "__main__":
    sys.exit(main())
