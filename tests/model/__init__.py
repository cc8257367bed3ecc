"""Tests of ``auditor.model``."""
