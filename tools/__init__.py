"""Operator tools that run from outside the project's processes (no Django needed)."""
