"""Tests of the producer kit (``auditor.capture``, ``auditor run``, ``auditor seal``)."""
