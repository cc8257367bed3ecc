"""The collect stage."""
