"""Horovod's ``horovod.runner.common.util``."""
