"""Tests of ``auditor.reason``."""
