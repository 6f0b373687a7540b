"""Backends execute one collective on flat host buffers; see operations.py for the choice."""
