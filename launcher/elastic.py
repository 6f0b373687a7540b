"""Elastic jobs: start again from the last commit when a rank or a host is lost, and on
more hosts when they join.

Why a loop of jobs: MPI cannot shrink or grow a running job. So the launcher runs one
mpirun after another (each a *generation*) on the slots there are, and the ranks' state
survives in the commits each host keeps on disk (horovodish/common/elastic_store.py).

    horovodishrun -np 4 --min-np 2 python train.py                   # this host
    horovodishrun -np 4 --min-np 2 -H h1:2,h2:2 python train.py      # a fixed list
    horovodishrun -np 4 --min-np 2 --max-np 8 \\
        --host-discovery-script ./hosts.sh python train.py           # hosts come and go

One generation:

1. Wait until the discovery script (or the fixed list), less what failed
   (discovery.Blacklist), gives enough slots: -np for the first start, --min-np after;
   fewer than --min-np for --elastic-timeout seconds ends the job with that reason.
   Remote hosts must answer over ssh (a host that does not is dropped like a lost one).
2. Run mpirun on up to --max-np of those slots, hosts of earlier generations first, each
   rank under rank_wrapper. The ranks learn the notice board's address (driver.py), the
   generation and the commit directory from the environment.
3. The job ends:
   * every rank exited 0: the job is done, unless rank 0 learned at a commit that the
     hosts changed (the discovery script shows new hosts, or dropped slots came back
     from their cooldown): then every rank left at that commit, and the next generation
     runs on the new set (Horovod's HostsUpdatedInterrupt);
   * a host was lost (the heartbeat said so): it is dropped; a rank was killed (its
     wrapper said so): its host loses a slot; the script failed (a rank exited non-zero
     by itself): nothing is dropped.
   Every restart and its reason is logged; after --reset-limit restarts the job ends
   with the last failure's exit code and reason. Without --reset-limit, a script
   failure that happens again before any new commit ends the job (it would fail the
   same way for ever).

The commit directory is removed when the launcher ends (on remote hosts over ssh; not
on hosts dropped as lost, whose copy stays in their temporary directory), unless the
user chose it (HOROVODISH_ELASTIC_DIR).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from horovodish.common.elastic_store import ENV_DIR
from horovodish.common.runtime import launcher_link

from .command import build_command, child_env
from .discovery import (Blacklist, DiscoveryScript, FixedHosts, describe, host_of_rank, plan,
                        slots_of)
from .driver import Driver, Reports
from .hosts import Host
from .process import run_job
from .remote import Remote, check_hosts, is_local, remote_hosts

DISCOVERY_INTERVAL = 1.0  # seconds between runs of the discovery script (Horovod's)


@dataclass(frozen=True)
class Settings:
    """The elastic flags, validated by cli.py."""

    np: int
    min_np: int
    max_np: int | None
    timeout: float
    reset_limit: int | None
    interval: float = DISCOVERY_INTERVAL


@dataclass
class Outcome:
    """Why a generation ended, and what to drop before the next."""

    kind: str  # done, restart, lost, killed, error, unknown
    text: str = ""
    lost_hosts: list[str] = field(default_factory=list)
    killed_on: str | None = None


def judge(code: int, reports: Reports, hosts: Sequence[Host]) -> Outcome:
    """Read a generation's end from mpirun's exit code and the ranks' reports. A lost
    host explains everything after it (its ranks' neighbours abort), a killed rank
    explains the others' exits (mpirun kills them), so those win over exit codes."""
    if code == 0:
        if reports.restart:
            return Outcome("restart", "the hosts changed; the ranks stopped at a commit")
        return Outcome("done")
    if reports.lost:
        ranks = sorted({int(r) for message in reports.lost for r in message.get("ranks", [])})
        names = list(dict.fromkeys(h for h in (host_of_rank(hosts, r) for r in ranks) if h))
        return Outcome("lost", f"host {', '.join(names)} lost (ranks "
                               f"{', '.join(map(str, ranks))}): "
                               f"{reports.lost[0].get('text', '')}".rstrip(": "),
                       lost_hosts=names)
    killed = [m for m in reports.exits if "signal" in m]
    if killed:  # the first one: mpirun's cleanup comes after it
        rank, number = int(killed[0].get("rank", -1)), int(killed[0]["signal"])
        host = host_of_rank(hosts, rank)
        return Outcome("killed", f"rank {rank} on {host} was killed by {_signal_name(number)}",
                       killed_on=host)
    codes = {int(m.get("rank", -1)): int(m["code"]) for m in reports.exits if "code" in m}
    if codes or reports.errors:
        # The first exception reported (at the excepthook, before that rank's shutdown
        # made the others fail) is the cause; else the first exit code.
        rank = next(iter(reports.errors)) if reports.errors else next(iter(codes))
        why = reports.errors.get(rank, "")
        exit_text = f" exited with code {codes[rank]}" if rank in codes else " failed"
        return Outcome("error", f"rank {rank} on {host_of_rank(hosts, rank)}{exit_text}"
                                + (f": {why}" if why else ""))
    return Outcome("unknown", f"mpirun exited with code {code} and no rank said why")


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


class HostView:
    """What the discovery source says now, less the blacklist; polled in a thread while
    a generation runs so that rank 0's question at a commit is answered at once."""

    def __init__(self, source: FixedHosts | DiscoveryScript, blacklist: Blacklist,
                 settings: Settings, log: Callable[[str], None]) -> None:
        self.source, self.blacklist, self.settings, self.log = source, blacklist, settings, log
        self.current: list[Host] = []
        self.order: list[str] = []
        self._found: dict[str, int] = {}
        self._error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        try:
            found = self.source.find()
        except RuntimeError as exc:
            if str(exc) != self._error:
                self.log(f"{exc} (keeping the hosts it last gave)")
            self._error = str(exc)
            return
        self._error = None
        with self._lock:
            self._found = found

    def next_plan(self) -> list[Host]:
        with self._lock:
            found = dict(self._found)
        return plan(self.blacklist.apply(found), self.order, self.settings.max_np)

    def changed(self) -> bool:
        """Whether the next job would run elsewhere than the current one (and could)."""
        hosts = self.next_plan()
        return slots_of(hosts) >= self.settings.min_np and hosts != self.current

    def start_polling(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="horovodishrun-discovery",
                                        daemon=True)
        self._thread.start()

    def stop_polling(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.settings.interval):
            self.refresh()


class ElasticRun:
    """One elastic job: the loop of generations (see the module docstring)."""

    def __init__(self, settings: Settings, source: FixedHosts | DiscoveryScript,
                 blacklist: Blacklist, remote: Remote, ssh_check: bool,
                 start: Callable[[list[Host], dict[str, str]], tuple[int, list[int]]],
                 log: Callable[[str], None]) -> None:
        self.settings, self.remote, self.ssh_check = settings, remote, ssh_check
        self.start, self.log, self.blacklist = start, log, blacklist
        self.view = HostView(source, blacklist, settings, log)
        self.driver = Driver(self.view.changed)
        self.used: list[str] = []

    def run(self, config: Mapping[str, str]) -> int:
        generation, resets = 0, 0
        reason = "first start"
        last_failure: tuple[str, int | None] | None = None
        last_seq: int | None = None
        try:
            while True:
                hosts = self._wait_for_slots(self.settings.np if generation == 0
                                             else self.settings.min_np)
                if hosts is None:
                    return 1
                generation += 1
                self.view.current = hosts
                self.view.order = list(dict.fromkeys([*self.view.order,
                                                      *(h.name for h in hosts)]))
                self.used = list(dict.fromkeys([*self.used, *(h.name for h in hosts)]))
                ranks = slots_of(hosts)
                self.log(f"generation {generation} on {ranks} rank{'s' * (ranks != 1)} "
                         f"({describe(hosts)}): {reason}")
                env = {**config, launcher_link.ENV_DRIVER: self._address(hosts),
                       launcher_link.ENV_TOKEN: self.driver.token,
                       launcher_link.ENV_GENERATION: str(generation),
                       launcher_link.ENV_LAUNCHED_AT: f"{time.time():.3f}"}
                self.view.start_polling()
                try:
                    code, signals = self.start(hosts, env)
                finally:
                    self.view.stop_polling()
                if signals:
                    return code
                reports = self.driver.reports(generation)
                outcome = judge(code, reports, hosts)
                self.log(f"generation {generation} ended: "
                         + (outcome.text or "every rank finished"))
                if outcome.kind == "done":
                    return 0
                if reports.commit_seq is not None:
                    last_seq = reports.commit_seq
                self._drop(outcome)
                resets += 1
                limit = self.settings.reset_limit
                if limit is not None and resets > limit:
                    self.log(f"ending the job: {resets - 1} restarts reached --reset-limit "
                             f"{limit}; the last failure: {outcome.text}")
                    return code or 1
                if limit is None and outcome.kind in ("error", "unknown"):
                    if last_failure == (outcome.kind, last_seq):
                        self.log(f"ending the job: it failed again with no commit in "
                                 f"between, which a restart cannot fix: {outcome.text}")
                        return code or 1
                    last_failure = (outcome.kind, last_seq)
                reason = ("restarting on the new hosts" if outcome.kind == "restart" else
                          f"restarting after: {outcome.text}") + \
                    (f"; resuming from commit {last_seq}" if last_seq else "")
        finally:
            self.driver.close()

    def _drop(self, outcome: Outcome) -> None:
        for host in outcome.lost_hosts:
            self._note_drop(host, None, self.blacklist.drop(host))
        if outcome.killed_on:
            self._note_drop(outcome.killed_on, 1, self.blacklist.drop(outcome.killed_on, 1))

    def _note_drop(self, host: str, slots: int | None, delay: float) -> None:
        what = f"host {host}" if slots is None else f"{slots} slot of {host}"
        self.log(f"dropping {what} " + ("for the rest of the job" if delay == float("inf")
                                        else f"for {delay:.0f} s (--blacklist-cooldown-range)"))

    def _wait_for_slots(self, need: int) -> list[Host] | None:
        """The hosts of the next generation, once they hold ``need`` slots (or, when
        --elastic-timeout runs out, at least --min-np); None: fewer than that."""
        settings = self.settings
        deadline = time.monotonic() + settings.timeout
        waiting = False
        while True:
            self.view.refresh()
            hosts = self.view.next_plan()
            if self.ssh_check:
                problems = check_hosts(remote_hosts(hosts), self.remote)
                for problem in problems:
                    host = problem.split(":", 1)[0]
                    self._note_drop(host, None, self.blacklist.drop(host))
                    self.log(f"host {problem}")
                if problems:
                    continue
            have = slots_of(hosts)
            if have >= need:
                return hosts
            if time.monotonic() >= deadline:
                if have >= settings.min_np:
                    return hosts
                self.log(f"ending the job: {have} slot{'s' * (have != 1)} available "
                         f"({describe(hosts)}), fewer than --min-np {settings.min_np}, "
                         f"for {settings.timeout:g} s (--elastic-timeout)")
                return None
            if not waiting:
                self.log(f"waiting for {need} slots: {have} available ({describe(hosts)}); "
                         f"up to {settings.timeout:g} s (--elastic-timeout)")
                waiting = True
            time.sleep(settings.interval)

    def _address(self, hosts: Sequence[Host]) -> str:
        """Where the ranks reach the notice board: loopback when every rank runs here,
        else this host's address on the route to the first remote host (a UDP socket's
        connect sends nothing; the host name can resolve to 127.0.1.1 on Debian)."""
        others = [h.name for h in hosts if not is_local(h.name)]
        if not others:
            return f"127.0.0.1:{self.driver.port}"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((others[0], 9))
                address = probe.getsockname()[0]
        except OSError:
            address = socket.gethostbyname(socket.gethostname())
        return f"{address}:{self.driver.port}"


def job_directory(environ: Mapping[str, str], token: str) -> tuple[str, bool]:
    """(the commit directory, whether the launcher removes it at the end): the user's
    HOROVODISH_ELASTIC_DIR, or a new one under this host's temporary directory (the
    same path is used on every host)."""
    chosen = environ.get(ENV_DIR)
    if chosen:
        return os.path.abspath(chosen), False
    return os.path.join(tempfile.gettempdir(), f"horovodish-elastic-{token[:12]}"), True


def remove_directory(path: str, hosts: Sequence[str], remote: Remote, ssh: bool) -> None:
    """Remove the commit directory here and, over ssh, on the remote hosts that still
    answer within the start timeout (the path is ours: no user input reaches the
    remote shell)."""
    shutil.rmtree(path, ignore_errors=True)
    others = [h for h in hosts if not is_local(h)] if ssh else []
    if not others:
        return
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            *remote.ssh_options()]

    def remove(host: str) -> None:
        try:
            subprocess.run([*argv, host, "rm", "-rf", "--", path], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=remote.start_timeout + 1)
        except (OSError, subprocess.TimeoutExpired):
            pass

    with ThreadPoolExecutor(max_workers=min(32, len(others))) as pool:
        list(pool.map(remove, others))


def main(args, runner, remote: Remote, config: Mapping[str, str], mpirun_extra: list[str],
         mpirun_env: Mapping[str, str], ssh: bool) -> int:
    """Run args.command elastically (run.main's elastic branch)."""
    def log(text: str) -> None:
        sys.stderr.write(f"horovodishrun[elastic +{time.monotonic() - started:.1f}s]: "
                         f"{text}\n")
        sys.stderr.flush()

    started = time.monotonic()
    default_slots = args.slots_per_host
    if args.host_discovery_script:
        source: FixedHosts | DiscoveryScript = DiscoveryScript(args.host_discovery_script,
                                                               default_slots)
    else:
        given = args.hostfile_hosts if args.hostfile_hosts is not None else args.hosts
        source = FixedHosts(given or [Host("localhost", args.max_np or args.num_proc)],
                            default_slots)
    settings = Settings(np=args.num_proc, min_np=args.min_np, max_np=args.max_np,
                        timeout=args.elastic_timeout, reset_limit=args.reset_limit)
    blacklist = Blacklist(tuple(args.blacklist_cooldown_range)
                          if args.blacklist_cooldown_range else None)
    wrapped = [sys.executable, "-m", "horovodish.launcher.rank_wrapper", *args.command]

    def start(hosts: list[Host], env: dict[str, str]) -> tuple[int, list[int]]:
        argv = build_command(runner.path, runner.flavour, slots_of(hosts), wrapped,
                             config=env, hosts=hosts, mpi_args=mpirun_extra,
                             environ=os.environ)
        signals: list[int] = []
        code = run_job(argv, env={**child_env(env, os.environ), **mpirun_env},
                       signals=signals)
        return code, signals

    job = ElasticRun(settings, source, blacklist, remote, ssh, start, log)
    directory, ours = job_directory(os.environ, job.driver.token)
    try:
        return job.run({**config, ENV_DIR: directory})
    finally:
        if ours:  # not on lost hosts: ssh would wait out its timeout for each
            there = job.blacklist.apply({host: 1 for host in job.used})
            remove_directory(directory, list(there), remote, ssh)
