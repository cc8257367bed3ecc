"""The pipeline: what turns a study into an :class:`~auditor.model.AuditResult`.

- :mod:`auditor.pipeline.audit` -- :class:`~auditor.pipeline.audit.Auditor` and
  :func:`~auditor.pipeline.audit.run_audit`: the one place the stages meet (walk, plan the
  reads, send them to the pool, fold what comes back), a generator of progress;
- :mod:`auditor.pipeline.worker` -- what a worker runs on a batch of periods: read, join,
  validate, judge, and what comes back of each (:class:`~auditor.pipeline.worker.FoldedPeriod`);
- :mod:`auditor.pipeline.study` -- the study's fold of its periods, a period at a time, and
  the study-level checks, accounting and gate at its end;
- :mod:`auditor.pipeline.pool` -- where the reading runs: in the process, a local pool of
  forked workers, or a Dask cluster;
- :mod:`auditor.pipeline.parts` -- shard parts: what ``audit --shard`` writes and ``merge``
  reads back, as data, never code.

It imports the stages and the reporters' pure pieces below it; nothing below imports it.
"""
