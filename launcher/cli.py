"""Command-line parsing and validation for ``horovodishrun``.

Why a separate module: every bad input is rejected here, through argparse (exit code 2,
message naming the flag), before anything is launched; later stages can trust the values.
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

from horovodish import __version__

from . import allocation
from .hosts import parse_hostfile, parse_hosts
from .remote import DEFAULT_START_TIMEOUT

LOG_LEVELS = ("trace", "debug", "info", "warning", "error")
CPU_OPERATIONS = ("mpi", "ring", "shm")  # as horovodish.common.config (a test checks)
GPU_OPERATIONS = ("nccl", "mpi")  # likewise


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
    return value


def _nonneg_int(text: str) -> int:
    return _int(text, 0)


def _positive_int(text: str) -> int:
    return _int(text, 1)


def _positive_float(text: str) -> float:
    value = _nonneg_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _port(text: str) -> int:
    value = _int(text, 1)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port 1..65535, got {text!r}")
    return value


def _interfaces(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if not all(names) or any(" " in name or "/" in name for name in names):
        raise argparse.ArgumentTypeError(f"expected interface names like eth0 or eth0,ib0, "
                                         f"got {text!r}")
    return names


def _hosts(text: str):
    try:
        return parse_hosts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _mpi_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:  # e.g. unbalanced quotes
        raise argparse.ArgumentTypeError(f"cannot split {text!r}: {exc}") from None


_VIA_MPIRUN = "not a horovodishrun flag: give mpirun's own option with --mpi-args"
# horovodrun flags a Horovod user may pass: (names, takes a value, why refused).
_REFUSED = [
    (("--config-file",), True, "no config files: pass the settings as flags or as "
                               "HOROVODISH_* variables (docs/configuration.md)"),
    (("--output-filename",), True, _VIA_MPIRUN),
    (("--tcp",), False, _VIA_MPIRUN),
    (("--binding-args",), True, _VIA_MPIRUN),
    (("--thread-affinity",), True, _VIA_MPIRUN),
    (("--num-nccl-streams",), True, "one NCCL stream per GPU and process set, not "
                                    "configurable (docs/gpu.md)"),
    (("--ccl-bgt-affinity",), True, "no oneCCL here"),
]
# ... and those that change nothing here, accepted with a note.
_NO_EFFECT = {
    "--mpi": "horovodish always runs on MPI",
    "--mpi-threads-disable": "the runtime asks MPI for the thread level it needs",
    "--prefix-output-with-timestamp": "the ranks' output goes through mpirun unchanged",
    "--log-without-timestamp": "log lines carry the rank, not a timestamp",
    "--log-hide-timestamp": "log lines carry the rank, not a timestamp",
}


class _Refuse(argparse.Action):
    """A horovodrun flag this launcher does not take: exit 2 saying why."""

    def __init__(self, option_strings: list[str], dest: str, why: str = "",
                 **kwargs: object) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"argument {option_string}: {self.why}")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser; flag names follow Horovod's ``horovodrun``."""
    p = argparse.ArgumentParser(
        prog="horovodishrun", allow_abbrev=False,
        description="Launch a horovodish job under mpirun (MPICH Hydra or Open MPI).",
        epilog="example: horovodishrun -np 4 -H host1:2,host2:2 python train.py")
    p.add_argument("-np", "--num-proc", type=_positive_int, metavar="N",
                   help="total number of processes (ranks) to start")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", type=_hosts, metavar="HOSTS",
                       help="comma-separated host:slots list, e.g. host1:2,host2:2")
    where.add_argument("--hostfile", metavar="FILE",
                       help="file of 'host slots=N', 'host:N' or 'host' lines")
    t = p.add_argument_group("tuning (forwarded to every rank as HOROVODISH_* variables)")
    t.add_argument("--fusion-threshold-mb", type=_nonneg_float, metavar="MB",
                   help="fusion buffer size in MiB (0 disables fusion)")
    t.add_argument("--cycle-time-ms", type=_nonneg_float, metavar="MS",
                   help="runtime cycle time in milliseconds")
    cache = t.add_mutually_exclusive_group()
    cache.add_argument("--cache-capacity", type=_nonneg_int, metavar="N",
                       help="response cache capacity (0 disables the cache)")
    cache.add_argument("--disable-cache", action="store_true",
                       help="no response cache (--cache-capacity 0)")
    t.add_argument("--timeline-filename", metavar="FILE",
                   help="write a Chrome-trace timeline from rank 0 to FILE")
    t.add_argument("--timeline-mark-cycles", action="store_true",
                   help="mark runtime cycles in the timeline")
    t.add_argument("--stall-check-warning-time-seconds", type=_nonneg_float, metavar="S",
                   help="warn about tensors stalled longer than S seconds")
    t.add_argument("--stall-check-shutdown-time-seconds", type=_nonneg_float, metavar="S",
                   help="shut the job down after S seconds of stall (0: never)")
    t.add_argument("--no-stall-check", action="store_true", help="disable the stall inspector")
    t.add_argument("--autotune", action="store_true",
                   help="tune fusion threshold and cycle time online")
    t.add_argument("--autotune-log-file", metavar="FILE", help="CSV log of autotune samples")
    t.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, metavar="LEVEL",
                   help="runtime log level: " + ", ".join(LOG_LEVELS))
    t.add_argument("--cpu-operations", type=str.lower, choices=CPU_OPERATIONS,
                   help="backend for host-memory collectives")
    t.add_argument("--gpu-operations", type=str.lower, choices=GPU_OPERATIONS,
                   help="path of CUDA tensors: nccl, or mpi (staged through host memory)")
    for what in ("allreduce", "allgather"):
        choice = t.add_mutually_exclusive_group()
        choice.add_argument(f"--hierarchical-{what}", dest=f"hierarchical_{what}",
                            action="store_const", const=True,
                            help=f"{what} in two levels across hosts: inside each host, "
                                 "then between hosts (default: chosen by topology and size)")
        choice.add_argument(f"--no-hierarchical-{what}", dest=f"hierarchical_{what}",
                            action="store_const", const=False,
                            help=f"never the hierarchical {what}")
    r = p.add_argument_group("hosts (ssh, network)")
    r.add_argument("-p", "--ssh-port", type=_port, metavar="PORT",
                   help="ssh port of the remote hosts")
    r.add_argument("-i", "--ssh-identity-file", metavar="FILE",
                   help="ssh private key for the remote hosts")
    r.add_argument("--start-timeout", type=_positive_float, metavar="S",
                   default=DEFAULT_START_TIMEOUT,
                   help="seconds for every remote host to answer over ssh before the "
                        f"job starts (default {DEFAULT_START_TIMEOUT:g}); a host that "
                        "does not is named and the job does not start")
    r.add_argument("--network-interface", "--network-interfaces", dest="network_interface",
                   type=_interfaces, metavar="IF[,IF...]",
                   help="network interface(s) for the job's traffic, e.g. eth0 (Hydra's "
                        "-iface takes the first)")
    e = p.add_argument_group(
        "elastic (a job that goes on from its last commit when ranks or hosts are lost, "
        "and grows when hosts join; docs/elastic.md)")
    e.add_argument("--min-np", "--min-num-proc", dest="min_np", type=_positive_int,
                   metavar="N", help="fewest ranks to run on (default -np); giving it, "
                                     "--max-np or --host-discovery-script makes the job "
                                     "elastic")
    e.add_argument("--max-np", "--max-num-proc", dest="max_np", type=_positive_int,
                   metavar="N", help="most ranks to run on (default -np; with "
                                     "--host-discovery-script, every slot discovered)")
    e.add_argument("--host-discovery-script", metavar="FILE",
                   help="executable printing the available hosts, one 'host' or "
                        "'host:slots' a line; run again every second")
    e.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=_positive_int,
                   default=1, metavar="N",
                   help="slots of a host given without a count (default 1)")
    e.add_argument("--elastic-timeout", type=_positive_float, default=600.0, metavar="S",
                   help="seconds to wait for --min-np slots before ending the job "
                        "(default 600)")
    e.add_argument("--reset-limit", type=_nonneg_int, metavar="N",
                   help="restarts after which the job ends (default: no limit, but a script "
                        "failure that repeats with no commit in between ends it)")
    e.add_argument("--blacklist-cooldown-range", type=_nonneg_float, nargs=2,
                   metavar=("MIN", "MAX"),
                   help="seconds a failed host or slot stays out: MIN doubled per earlier "
                        "failure of the host, plus up to MIN at random, at most MAX "
                        "(default: for the rest of the job)")
    p.add_argument("--gloo", action="store_true",
                   help="start the ranks without mpirun (horovodishrun runs the job's PMI "
                        "server and starts each rank, locally or over ssh; MPI is still the "
                        "transport); also what happens where no mpirun is installed")
    p.add_argument("--mpi-args", type=_mpi_args, default=[], metavar='"ARGS"',
                   help="extra arguments for mpirun, split like a shell would (but never run by one); "
                        'write --mpi-args="-v" when ARGS is a single dash option')
    p.add_argument("--verbose", action="store_true",
                   help="print the mpirun command line to stderr before running it")
    p.add_argument("--check-build", action="store_true",
                   help="show available frameworks, backends and MPI, then exit")
    p.add_argument("--version", action="version", version=f"horovodishrun {__version__}")
    for flag, why in _NO_EFFECT.items():
        p.add_argument(flag, action="append_const", const=flag, dest="no_effect",
                       default=[], help=f"accepted for horovodrun scripts; no effect ({why})")
    for names, takes_value, why in _REFUSED:
        p.add_argument(*names, action=_Refuse, why=why, nargs=None if takes_value else 0)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the program and its arguments, run once per rank")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv``; exits with code 2 and a message on bad input.

    Adds ``hostfile_hosts`` (parsed hostfile entries, or None) to the namespace.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.disable_cache:
        args.cache_capacity = 0
    for flag in dict.fromkeys(args.no_effect):
        print(f"horovodishrun: {flag} has no effect ({_NO_EFFECT[flag]})", file=sys.stderr)
    args.hostfile_hosts = None
    if args.check_build:
        return args
    args.elastic = any(value is not None for value in
                       (args.min_np, args.max_np, args.host_discovery_script))
    if args.elastic:
        _check_elastic(parser, args)
    if not args.command:
        parser.error("a command to run is required, e.g. horovodishrun -np 2 python train.py")
    if not (args.hosts or args.hostfile or args.elastic):
        _hosts_from_environment(parser, args)
    if args.hostfile is not None:
        try:
            args.hostfile_hosts = parse_hostfile(Path(args.hostfile).read_text())
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            parser.error(f"argument --hostfile: {args.hostfile}: {exc}")
    if args.num_proc is None:
        given = args.hostfile_hosts if args.hostfile_hosts is not None else args.hosts
        if not given or any(host.slots is None for host in given):
            parser.error("-np/--num-proc is required")
        args.num_proc = sum(host.slots for host in given)
    if not args.elastic:
        _check_slots(parser, args)
    return args


def _hosts_from_environment(parser: argparse.ArgumentParser,
                            args: argparse.Namespace) -> None:
    """No -H or --hostfile: a hostfile a scheduler named, or the Slurm allocation
    (launcher/allocation.py)."""
    try:
        found = allocation.from_environment(os.environ)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        parser.error(f"inside a Slurm allocation, but its hosts cannot be read ({exc}); "
                     "pass -H host:slots,...")
    if found is None:
        return
    kind, where = found
    if kind == "hostfile":
        args.hostfile = where
    else:
        args.hosts = where


def _check_elastic(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill in -np, --min-np and --max-np from each other, as horovodrun does, and
    refuse what cannot run."""
    if args.num_proc is None:
        args.num_proc = args.min_np
    if args.num_proc is None:
        parser.error("an elastic job needs -np or --min-np")
    if args.min_np is None:
        args.min_np = args.num_proc
    if args.max_np is None and not args.host_discovery_script:
        args.max_np = max(args.num_proc, args.min_np)
    if args.min_np > args.num_proc:
        parser.error(f"--min-np {args.min_np} is more than -np {args.num_proc}")
    if args.max_np is not None and args.max_np < args.num_proc:
        parser.error(f"--max-np {args.max_np} is less than -np {args.num_proc}")
    if args.host_discovery_script and (args.hosts or args.hostfile):
        parser.error("--host-discovery-script finds the hosts: leave out -H/--hostfile")
    low_high = args.blacklist_cooldown_range
    if low_high and low_high[0] > low_high[1]:
        parser.error(f"--blacklist-cooldown-range: MIN {low_high[0]:g} is more than MAX "
                     f"{low_high[1]:g}")


def _check_slots(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """More ranks than the slots given: Hydra would start them anyway, several to a slot
    (Open MPI and horovodrun refuse); refuse here too, for both, unless --mpi-args asks
    for --oversubscribe. Hosts without a count leave it to mpirun."""
    hosts = args.hostfile_hosts if args.hostfile_hosts is not None else args.hosts
    if not hosts or any(host.slots is None for host in hosts) or \
            "--oversubscribe" in args.mpi_args:
        return
    slots = sum(host.slots for host in hosts)
    if args.num_proc > slots:
        where = "--hostfile" if args.hostfile_hosts is not None else "-H/--hosts"
        parser.error(f"-np {args.num_proc} needs {args.num_proc} slots but {where} gives "
                     f"{slots} ({', '.join(f'{h.name}:{h.slots}' for h in hosts)}); raise "
                     "the slot counts, or leave them out to let mpirun decide.")
