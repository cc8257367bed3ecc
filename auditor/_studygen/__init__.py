"""Generate synthetic run-evidence studies that follow ``evidence-contract.md`` v1 exactly.

A private module behind ``auditor example OUT [--kind example|mixed|scale]``; the single
source of the example and defect studies the auditor is tested and benchmarked on (the
clone's ``fixtures/generate.py`` re-exports it for ``python -m fixtures.generate``). It
writes files and imports nothing else of the auditor. It writes the contract's layout
(``protocol.json``, ``execution_commits.json``, ``accounting/sacct-raw.psv``,
``pairs/<pair>/period-<n>.json`` and one ``<pair>-<gpus>gpu/attempt-<job>/`` directory per
attempt) from a small declarative description:

* :class:`StudySpec` -> a list of :class:`ElementSpec` (array elements, i.e. actual
  SLURM jobs) -> a list of :class:`PeriodSpec` (periods launched in that element, in
  launch order) -> optionally several :class:`AttemptSpec` (a retried period).
* :func:`write_study` writes a spec; :func:`example_spec` is the seed study of
  ``002_968e25e0521cc66f.txt`` (written as it is to the bundled example study,
  ``fixtures/example_study``); :func:`mixed_spec` has one period per outcome;
  :func:`scale_spec` builds large studies for benchmarks; :func:`generate` picks a preset.

Modules, each importing only the ones before it: :mod:`.spec` (constants, spec types,
helpers), :mod:`.plan` (concrete times and identities), :mod:`.evidence` (file contents),
:mod:`.write` (the sacct dump, attempt directories, period records), :mod:`.presets`.

Outcomes (see :data:`OUTCOMES`) and what each writes are documented on
:data:`OUTCOME_NOTES`. Everything is deterministic: no wall clock, no unseeded
randomness (variation comes from SHA-256 of a label, see :func:`spec._jitter`), and
stable content, so two runs write byte-identical trees. :func:`write_study` refuses a
root that exists and is not an empty directory.

Anchors: the presets write ``protocol.json`` *without* ``anchors`` (so no protocol
input has to be passed on the command line). A spec can set ``protocol_inputs``;
those files are then written under ``protocol-inputs/`` and their SHA-256 values
are put into ``protocol["anchors"]`` under the same names.
"""

from __future__ import annotations

from auditor._studygen.presets import (
    MIXED_ARRAY_JOB_ID,
    PRESETS,
    SEED_ARRAY_JOB_ID,
    SEED_ELAPSED_TOTAL_S,
    SEED_LAST_END,
    SEED_RESERVATION_GPU_NS,
    SEED_TASK_GPU_NS,
    example_spec,
    generate,
    mixed_spec,
    scale_spec,
    with_outcome,
)
from auditor._studygen.spec import (
    GPU_MEMORY_MIB,
    GPU_NAME,
    MIB,
    MODEL,
    MS,
    NS,
    OUTCOME_NOTES,
    OUTCOMES,
    SACCT_FORMAT,
    SEED_COMMIT,
    SEED_DAY_NS,
    SEED_DISPATCH,
    SEEDS,
    SHUTDOWN_FLAG,
    TERMINAL_MISSING_ERROR,
    WORKLOADS,
    AttemptSpec,
    ElementSpec,
    PeriodSpec,
    StudySpec,
    default_protocol,
)
from auditor._studygen.write import write_study

__all__ = [
    "GPU_MEMORY_MIB", "GPU_NAME", "MIB", "MIXED_ARRAY_JOB_ID", "MODEL", "MS", "NS",
    "OUTCOMES", "OUTCOME_NOTES", "PRESETS", "SACCT_FORMAT", "SEEDS", "SEED_ARRAY_JOB_ID",
    "SEED_COMMIT", "SEED_DAY_NS", "SEED_DISPATCH", "SEED_ELAPSED_TOTAL_S", "SEED_LAST_END",
    "SEED_RESERVATION_GPU_NS", "SEED_TASK_GPU_NS", "SHUTDOWN_FLAG", "TERMINAL_MISSING_ERROR",
    "WORKLOADS", "AttemptSpec", "ElementSpec", "PeriodSpec", "StudySpec", "default_protocol",
    "example_spec", "generate", "mixed_spec", "scale_spec", "with_outcome", "write_study",
]
