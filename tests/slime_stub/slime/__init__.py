"""Test stand-in for slime (see tests/slime_stub/README.md)."""
