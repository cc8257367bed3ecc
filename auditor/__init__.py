"""auditor: a post-hoc run-evidence auditor for GPU job arrays on SLURM.

API map (the command line, ``auditor ...``, is :mod:`auditor._cli`):

- :func:`run_audit` / :class:`Auditor` (:mod:`auditor.pipeline.audit`) -- collect, validate and
  reason over one study root; returns an :class:`AuditResult` (``Auditor.run()`` is a
  generator yielding progress); :class:`AuditOptions` and :class:`Waiver` set it up;
- :func:`write_outputs` (:mod:`auditor.report.output`) -- write the report, tables, plots and
  output manifest atomically; :func:`verify_outputs` re-checks them; :func:`load`
  (:mod:`auditor.report.load`) reads an audit's outputs back, verified, its tables as pandas
  DataFrames (:class:`LoadedAudit`);
- :mod:`auditor.model` -- the frozen types every stage shares (it imports no stage);
- :mod:`auditor.collect` -- one streaming reader per evidence kind; :mod:`auditor.validate`
  -- integrity and cross-checks; :mod:`auditor.reason` -- exits, verdicts, configurations,
  accounting, the gate; :mod:`auditor.report` -- markdown, tables, plots, manifest;
- :mod:`auditor.rules` -- every rule as data, with its policy (the reason it blocks
  with, how it fails the gate, the report's cross-check family);
- :mod:`auditor.capture` -- the producer kit: what a run writes so it can be audited;
- :mod:`auditor.schema` -- the JSON Schemas shipped in ``auditor/schemas``.

The names below are imported on first use, so ``import auditor`` (and the producer kit
under it) costs nothing of the audit's.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["AuditOptions", "AuditResult", "Auditor", "LoadedAudit", "Waiver", "__version__",
           "load", "run_audit", "verify_outputs", "write_outputs"]

_LAZY = {
    "run_audit": "auditor.pipeline.audit", "Auditor": "auditor.pipeline.audit",
    "AuditOptions": "auditor.model", "AuditResult": "auditor.model", "Waiver": "auditor.model",
    "write_outputs": "auditor.report.output", "verify_outputs": "auditor.report.output",
    "load": "auditor.report.load", "LoadedAudit": "auditor.report.load",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'auditor' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
