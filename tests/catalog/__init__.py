"""Tests of the catalogue across studies (``auditor catalog``, ``query``) and the rerun plan."""
