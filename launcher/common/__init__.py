"""Horovod's ``horovod.runner.common``: what scripts import from it."""
