"""``python -m auditor``: the same as the ``auditor`` command."""

from auditor._cli import entry

entry()
