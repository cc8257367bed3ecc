"""The reason stage."""
