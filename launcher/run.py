"""``horovodishrun``: start N copies of a command under mpirun, configured for horovodish.

Contract
--------
``horovodishrun -np N [-H host:slots,... | --hostfile F] [flags] command [args...]`` starts
``command`` N times under the ``mpirun`` of this environment (the one next to the Python
interpreter first, e.g. the ``mpich`` wheel's, then ``mpirun``/``mpiexec`` on PATH). Each
process is one rank; inside it, ``hvd.init()`` reads rank, size and local rank from MPI.

* Configuration flags become ``HOROVODISH_*`` environment variables on every rank
  (``--fusion-threshold-mb 32`` -> ``HOROVODISH_FUSION_THRESHOLD=33554432``, ...). Variables
  already set in the caller's environment (``HOROVODISH_*``, ``HOROVOD_*``) reach the ranks
  too; a flag wins over an inherited variable of the same name.
* The command is executed as an argument list, never through a shell.
* The exit code is the job's: 0 when every rank exits 0, non-zero otherwise. A job that
  Ctrl-C / SIGTERM (signal N) ended gives 128 + N: the signal is forwarded to every local
  process of the job, and whatever is still alive 5 s later is killed. A rank killed by
  signal N on its own gives what mpirun reports: N with MPICH's Hydra, which does not
  tell it apart from ``exit(N)``.
* ``plain mpirun -np N python train.py`` works as well; the launcher adds only convenience.
* ``--gloo`` (Horovod's flag), or no mpirun installed: the launcher starts the ranks
  itself, locally and over ssh, as clients of a PMI server it runs; MPI is still the
  transport (launcher/direct.py).
* Across hosts (``-H``/``--hostfile`` naming hosts other than this one, started over
  ssh): every remote host must first answer ``ssh HOST true`` within --start-timeout
  seconds (default 30), all checked at once; otherwise the launcher names each host that
  did not, with ssh's reason, and exits 255 without starting anything. --ssh-port,
  --ssh-identity-file and a ConnectTimeout of the start timeout go to every ssh the job
  makes; --network-interface picks the interface for mpirun's and the ranks' traffic
  (docs/multihost.md).

Example::

    horovodishrun -np 4 -H server1:2,server2:2 --fusion-threshold-mb 32 python train.py
    # train.py
    import horovodish.torch as hvd
    hvd.init()
    print(hvd.rank(), hvd.size())   # 0..3, 4

* Elastic (``--min-np``, ``--max-np`` or ``--host-discovery-script``): when a rank or a
  host is lost, the job starts again on the slots that are left, from the last
  ``state.commit()``; it grows at a commit when hosts join (launcher/elastic.py,
  docs/elastic.md).

Exit codes of the launcher itself: 2 for bad arguments, 127 when no mpirun is found (for an
elastic job, the one kind that needs it), 255
when a remote host does not answer over ssh.
"""
from __future__ import annotations

import os
import shlex
import sys

from . import direct, elastic
from . import mpirun as mpirun_mod
from .cli import parse_args
from .command import build_command, child_env
from .envvars import config_env, rank_defaults
from .hosts import hostfile_for
from .process import run_job
from .remote import Remote, check_hosts, mpirun_args, rank_env, remote_hosts, uses_ssh


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the job, return its exit code.

    See the module docstring for the contract.
    """
    args = parse_args(argv)
    if args.check_build:
        from .check_build import report
        print(report())
        return 0

    runner = mpirun_mod.locate()
    remote = Remote(args.ssh_port, args.ssh_identity_file, args.start_timeout,
                    args.network_interface or ())
    hosts = args.hostfile_hosts if args.hostfile_hosts is not None else args.hosts
    by_itself = not args.elastic and (args.gloo or runner is None)
    if runner is None and not by_itself:
        print(mpirun_mod.MISSING_MESSAGE, file=sys.stderr)
        return 127
    if runner is not None and runner.flavour == "unknown" and not by_itself:
        print(f"horovodishrun: warning: cannot tell which MPI {runner.path} belongs to; "
              "using MPICH Hydra syntax", file=sys.stderr)

    over_ssh = by_itself or uses_ssh(args.mpi_args, os.environ)
    if args.elastic:  # hosts may change between starts: the elastic loop checks each
        config = {**rank_defaults(os.environ), **config_env(args), **rank_env(remote)}
        extra_args, mpirun_env = mpirun_args(remote, runner.flavour, over_ssh)
        for name, value in mpirun_env.items():
            if os.environ.get(name):
                mpirun_env[name] = f"{value} {os.environ[name]}"
        return elastic.main(args, runner, remote, config, [*extra_args, *args.mpi_args],
                            mpirun_env, over_ssh)
    others = remote_hosts(hosts)
    if others and over_ssh:
        problems = check_hosts(others, remote)
        if problems:
            print("horovodishrun: cannot start the job: "
                  + ("; ".join(problems) if len(problems) == 1 else
                     f"{len(problems)} hosts did not answer over ssh:\n  "
                     + "\n  ".join(problems)), file=sys.stderr)
            return 255
    if by_itself:  # (--gloo, or no mpirun here: launcher/direct.py)
        config = {**rank_defaults(os.environ), **config_env(args), **rank_env(remote)}
        return direct.run(args.num_proc, hosts, args.command, config, remote, args.verbose)
    hostfile, temporary = None, False
    if args.hostfile_hosts is not None:
        hostfile, temporary = hostfile_for(args.hostfile, args.hostfile_hosts, runner.flavour)
    try:
        config = {**rank_defaults(os.environ), **config_env(args), **rank_env(remote)}
        extra_args, mpirun_env = mpirun_args(remote, runner.flavour, bool(others) and over_ssh)
        for name, value in mpirun_env.items():
            if os.environ.get(name):  # the caller's own options after ours
                mpirun_env[name] = f"{value} {os.environ[name]}"
        argv_ = build_command(runner.path, runner.flavour, args.num_proc, args.command,
                              config=config, hosts=args.hosts, hostfile=hostfile,
                              mpi_args=[*extra_args, *args.mpi_args], environ=os.environ)
        if args.verbose:
            print(shlex.join(argv_), file=sys.stderr, flush=True)
        try:
            return run_job(argv_, env={**child_env(config, os.environ), **mpirun_env})
        except OSError as exc:
            print(f"horovodishrun: cannot start {runner.path}: {exc}", file=sys.stderr)
            return 127 if isinstance(exc, FileNotFoundError) else 126
    finally:
        if temporary:
            os.unlink(hostfile)


if __name__ == "__main__":
    sys.exit(main())
