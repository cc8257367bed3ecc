"""auditor: a post-hoc run-evidence auditor for GPU job arrays on SLURM.

API map (the command line, ``auditor ...``, is :mod:`auditor._cli`):

- :func:`auditor.audit.run_audit` / :class:`auditor.audit.Auditor` -- collect, validate
  and reason over one study root; returns an :class:`auditor.audit.AuditResult`
  (``Auditor.run()`` is a generator yielding progress);
- :func:`auditor.report.output.write_outputs` -- write the report, tables, plots and output
  manifest atomically; :func:`auditor.report.output.verify_outputs` re-checks them;
  a :class:`auditor.report.plots.Plotter` started before an audit draws its plots in a
  helper process meanwhile;
- :mod:`auditor.collect` -- one streaming reader per evidence kind (``sacct``,
  ``allocator_trace``, ``training_log``, ``trial``, ``device``, ``period``, ``protocol``);
- :mod:`auditor.validate` -- path safety and cross-checks; :mod:`auditor.reason` -- exit
  classification, verdicts, accounting, the gate;
- :mod:`auditor.catalogue` -- every rule (id, symbol, severity, template);
  :mod:`auditor.model` -- the frozen record types every stage shares;
- :mod:`auditor.schema` -- the JSON Schemas shipped in ``auditor/schemas``.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
