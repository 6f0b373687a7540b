"""Build the mpirun argv and the child environment; pure functions, no I/O.

Why an argv list: it goes straight to ``exec`` (no shell), so host names, paths and user
arguments can never be reinterpreted as shell syntax.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from .envvars import PREFIXES
from .hosts import Host, hosts_arg

# Open MPI does not forward the environment to remote hosts unless told to; these keep a
# venv-based job working there too.
OPENMPI_FORWARD = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")


def build_command(mpirun: str, flavour: str, num_proc: int, command: Sequence[str], *,
                  config: Mapping[str, str] | None = None, hosts: list[Host] | None = None,
                  hostfile: str | None = None, mpi_args: Sequence[str] = (),
                  environ: Mapping[str, str] | None = None) -> list[str]:
    """The full mpirun argv.

    MPICH Hydra: ``mpirun -np N [-hosts H | -f F] -genv NAME VALUE ... <mpi-args> cmd...``
    Open MPI:    ``mpirun -np N --oversubscribe [-H H | --hostfile F] -x NAME=VALUE ...
    -x NAME (each HOROVODISH_*/HOROVOD_* and PATH-like variable already set) <mpi-args> cmd...``
    Any other flavour gets the Hydra syntax. ``hostfile`` must already be in the right syntax.
    """
    config = dict(config or {})
    environ = environ or {}
    argv = [mpirun, "-np", str(num_proc)]
    if flavour == "openmpi":
        argv.append("--oversubscribe")
        if hosts:
            argv += ["-H", hosts_arg(hosts)]
        elif hostfile:
            argv += ["--hostfile", hostfile]
        for name, value in config.items():
            argv += ["-x", f"{name}={value}"]
        for name in sorted(environ):
            if name not in config and (name.startswith(PREFIXES) or name in OPENMPI_FORWARD):
                argv += ["-x", name]
    else:
        if hosts:
            argv += ["-hosts", hosts_arg(hosts)]
        elif hostfile:
            argv += ["-f", hostfile]
        for name, value in config.items():
            argv += ["-genv", name, value]
    argv += list(mpi_args)
    argv += list(command)
    return argv


def child_env(config: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """mpirun's own environment: the caller's plus the configuration (config wins)."""
    env = dict(environ)
    env.update(config)
    return env
