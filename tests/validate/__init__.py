"""Tests of ``auditor.validate``."""
