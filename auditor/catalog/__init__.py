"""A catalogue across studies: finished audits gathered into hive-partitioned Parquet tables.

``auditor catalog OUT... --into CAT`` (:func:`store.add_audits`) adds audits, each verified
first, as ``CAT/<table>/study=<name>/part-0.parquet``; ``auditor query CAT "SQL"``
(:func:`query.run_query`, which needs duckdb) runs DuckDB over them with built-in views
(``verdicts``, ``gpu_seconds``, ``suspect_hardware``); ``auditor rerun DIR``
(:func:`rerun.rerun_plan`) groups an audit's unresolved periods into ``--array=`` specs.
The catalogue only reads audits' outputs: it sits above :mod:`auditor.report` (whose
``verify_outputs`` it uses) and below the command line.
"""

from __future__ import annotations

from auditor.catalog.rerun import RerunGroup, array_spec, rerun_plan
from auditor.catalog.store import CATALOG_TABLES, SCHEMA_VERSION, Added, add_audits

__all__ = ["CATALOG_TABLES", "SCHEMA_VERSION", "Added", "RerunGroup", "add_audits",
           "array_spec", "rerun_plan"]
