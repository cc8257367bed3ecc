"""The producer kit: what a training job uses to write the evidence the audit reads.

- :class:`Trace` -- a process's allocator trace (phase records and memory samples);
- :func:`write_device_evidence` -- a process's device file (its GPU, host, pids);
- :mod:`auditor.capture.launch` -- ``auditor run``: the launcher wrapper a batch script
  calls, writing the trial record and the training log (:mod:`auditor.capture.step`: its
  ``--step ROLE`` form, one process of a multi-node attempt);
- :func:`record_exit` -- a launcher's own record of one process's end
  (``processes/<host>-<role>-<pid>.json``);
- :mod:`auditor.capture.seal` -- ``auditor seal``: the period record (the manifest);
- :mod:`auditor.capture.example` -- a CPU-only example trainer using all of it;
  :mod:`auditor.capture.multinode_example` -- the processes of a multi-node one.

Imports of this package stay light (neither pandas nor pyarrow, nor torch unless it is
installed): a training process pays nothing for it. Nothing here prints; ``auditor._cli``
does.
"""

from __future__ import annotations

from auditor.capture.device import write_device_evidence
from auditor.capture.processes import record_exit
from auditor.capture.trace import Trace

__all__ = ["Trace", "record_exit", "write_device_evidence"]
