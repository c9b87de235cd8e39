"""Reusable helpers for tests that run real servers on loopback."""
