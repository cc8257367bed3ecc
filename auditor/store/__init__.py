"""The results store: the one place that knows whether an audit's records sit in memory or
on disk.

The pipeline puts a study's periods, verdicts and rows here as it judges them; the
reasoning and the reporters read them back, complete, through the same interfaces
whatever the study's size. The store decides by size, invisibly
(:func:`~auditor.store.settings.spill_from`): a small study's records stay objects, a large
one's are packed or spilled to unnamed temporary files under
:func:`~auditor.store.settings.spill_directory`, which leave nothing behind.

- :class:`Kept`: a sequence appended in order (periods, verdicts, inputs, a report's
  groups); :class:`Held`: one value kept packed; :class:`Mapped`: a view of a function of
  each record.
- :class:`SortedRows`, :class:`EvidenceStore`, :func:`kept_sorted`: rows given back sorted
  (a study's evidence rows and inputs).
- :mod:`auditor.store.tables`: the output tables' columns, and their rows kept as Arrow on
  disk (it imports pyarrow, so it is imported by name, never from here);
  :mod:`auditor.store.rows`: those rows made from a period, in the workers.
- :mod:`auditor.store.heap`: the process's collector and C heap.
- :mod:`auditor.store.pickling`: how records cross between processes.
"""

from auditor.store.kept import Held, Kept, Mapped
from auditor.store.pickling import pickles_fast, register_model
from auditor.store.settings import (
    SPILL_FROM,
    SPILL_FROM_VARIABLE,
    check_outside,
    spill_directory,
    spill_from,
    spilling,
    spilling_into,
    temporary_file,
)
from auditor.store.sorted import EvidenceStore, SortedRows, kept_sorted

register_model()

__all__ = ["SPILL_FROM", "SPILL_FROM_VARIABLE", "EvidenceStore", "Held", "Kept", "Mapped",
           "SortedRows", "check_outside", "kept_sorted", "pickles_fast", "spill_directory",
           "spill_from", "spilling", "spilling_into", "temporary_file"]
