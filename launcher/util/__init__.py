"""Horovod's ``horovod.runner.util``: the helpers scripts and Horovod's test utilities
import from it."""
