"""The auditor's exception root and its per-stage subclasses.

Exceptions here mean the auditor cannot do what was asked at all (a usage or
unreadable-input error: exit 2). Anything wrong *inside* the evidence is a
:class:`~auditor.model.Finding`, never an exception.
"""

from __future__ import annotations


class AuditorError(Exception):
    """Root of every error the auditor raises on purpose."""

    exit_code = 2

    def diagnostics(self) -> str:
        """One line telling the user what went wrong and what to do."""
        return str(self)


class UsageError(AuditorError):
    """The command line cannot be carried out (bad root, bad output directory...)."""


class InputError(AuditorError):
    """An input named on the command line cannot be read or understood."""


class SacctFormatError(InputError):
    """A sacct dump that cannot be read safely (fixed-width, wrong field count...)."""


class OutputError(AuditorError):
    """The output directory cannot be written as asked."""


class VerifyError(AuditorError):
    """An output directory lacks a usable output manifest."""
