"""An emulated cluster on one machine: N hosts h1..hN, each its own network and UTS
namespace, their eth0 links on a bridge in a namespace of its own, shaped with tc.

Why: nothing multi-host (the launcher's -H, local/cross ranks, the hierarchical
allreduce, a host dropping off the network) can be tested on one host otherwise, and CI
has one machine. Jobs start exactly as on real hosts: ``horovodishrun -H h1:2,h2:2`` or
plain ``mpirun`` on h1 reaches h2 through an ssh stand-in (bin/ssh) placed first on PATH.

    with Cluster(hosts=2, rate="1gbit") as cluster:
        result = cluster.run("h1", ["horovodishrun", "-np", "4", "-H", "h1:2,h2:2", ...])
        print(cluster.link_bytes())        # bytes each host sent over its link

Layout of one cluster (prefix ``hvc<pid>``, unique per creating process; a process that
builds a second one at once adds letters: ``hvc<pid>s``):

* namespaces ``hvc<pid>-br`` (bridge ``br0``, port ``pK`` per host) and ``hvc<pid>-hK``
  (``lo`` and ``eth0`` = 10.77.0.K/24, the other end of ``pK``); no interface in the
  caller's namespace, no route anywhere else: every address stays inside the cluster.
* each link shaped in both directions: ``tbf rate RATE`` on ``eth0`` (host to bridge)
  and on ``pK`` (bridge to host), with ``netem delay DELAY`` before the host's tbf when
  asked (one-way DELAY from each host, a round trip of 2 x DELAY between two hosts).
* state under /run/horovodish-cluster/<prefix>: bin/ (ssh stand-in, on-host), the UTS
  namespace files, etc-hosts (bind-mounted over /etc/hosts on every host), ssh.log.

Teardown (``down``, the context manager, atexit) kills every process left in a host's
namespaces, then deletes the namespaces and the state. A reaper process started with the
cluster does the same if its creator dies without it (SIGKILL included), and every new
cluster first removes what killed runs left (any ``hvc<pid>`` whose creator is gone).

Run as a script for the bench or by hand (root and iproute2 needed)::

    python tests/cluster/cluster.py run --hosts 2 --rate 1gbit [--delay 1ms] -- CMD...
    python tests/cluster/cluster.py cleanup      # remove what killed runs left
"""
from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path("/run/horovodish-cluster")
SUBNET = "10.77.0"
BIN = Path(__file__).resolve().parent / "bin"
PREFIX_RE = re.compile(r"^hvc(\d+)[a-z]*$")  # hvc<creator pid>, a letter or more for a second one
# MPICH's default netmod (UCX) moves bytes between namespaces of one kernel through
# shared memory, past the shaped links; libfabric's TCP provider puts them on the wire.
MPICH_TCP_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def missing_requirements() -> str | None:
    """Why a cluster cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces)"
    for tool in ("ip", "tc", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"the emulated cluster needs {tool} (iproute2 / util-linux)"
    return None


def _sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a command; with check, a failure raises naming the command and its stderr."""
    done = subprocess.run(list(argv), text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, **kwargs)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit code {done.returncode}: "
                           f"{done.stderr.strip()}")
    return done


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), None if it is gone: with the pid
    it tells the creator of a cluster from a later process that reuses its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9 (tc's units: bit, kbit, mbit, gbit)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", rate.strip().lower())
    if not match:
        raise ValueError(f"rate {rate!r}: expected e.g. 100mbit, 1gbit, 10gbit")
    return float(match[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match[2]]


class Cluster:
    """N emulated hosts; see the module docstring. Build with ``up()`` (or ``with``)."""

    def __init__(self, hosts: int = 2, rate: str = "1gbit", delay: str | None = None,
                 prefix: str | None = None) -> None:
        if not 1 <= hosts <= 200:
            raise ValueError("hosts: 1 to 200")
        rate_bits(rate)
        self.hosts = [f"h{k}" for k in range(1, hosts + 1)]
        self.rate, self.delay = rate, delay
        self.prefix = prefix or f"hvc{os.getpid()}"
        self.state = ROOT / self.prefix
        self.bridge = f"{self.prefix}-br"
        self._reaper: subprocess.Popen | None = None
        self._built = False

    # -- names ------------------------------------------------------------------------
    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts.index(host) + 1}"

    @property
    def bin(self) -> Path:
        """Directory to put first on PATH: the ssh stand-in and on-host."""
        return self.state / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a command run on a host: the caller's, the ssh stand-in first
        on PATH, MPICH's bytes over TCP (through the shaped links), plus extra."""
        env = {**os.environ, **MPICH_TCP_ENV, **extra}
        env["PATH"] = f"{self.bin}:{env.get('PATH', os.defpath)}"
        return env

    # -- build and tear down ------------------------------------------------------------
    def up(self) -> "Cluster":
        why = missing_requirements()
        if why:
            raise RuntimeError(why)
        cleanup_stale()
        atexit.register(self.down)
        self._built = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        state = self.state
        (state / "hosts").mkdir(parents=True, exist_ok=True)
        (state / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        self._start_reaper()
        shutil.copytree(BIN, state / "bin")
        (state / "ssh.log").touch()
        (state / "etc-hosts").write_text(
            "127.0.0.1 localhost\n::1 localhost\n"
            + "".join(f"{self.address(h)} {h}\n" for h in self.hosts))
        _sh("ip", "netns", "add", self.bridge)
        br = ["ip", "-n", self.bridge]
        _sh(*br, "link", "add", "br0", "type", "bridge")
        _sh(*br, "link", "set", "br0", "up")
        _sh(*br, "link", "set", "lo", "up")
        for k, host in enumerate(self.hosts, 1):
            ns, port = self.netns(host), f"p{k}"
            home = state / "hosts" / host
            home.mkdir()
            (home / "netns").write_text(ns + "\n")
            uts = home / "uts"
            uts.touch()
            _sh("unshare", f"--uts={uts}", "hostname", host)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                "peer", "name", port, "netns", self.bridge)
            _sh(*br, "link", "set", port, "master", "br0")
            _sh(*br, "link", "set", port, "up")
            h = ["ip", "-n", ns]
            _sh(*h, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _sh(*h, "link", "set", "eth0", "up")
            _sh(*h, "link", "set", "lo", "up")
            self._shape(ns, "eth0", self.delay)
            self._shape(self.bridge, port, None)

    def _shape(self, ns: str, dev: str, delay: str | None) -> None:
        """tbf at the rate (a burst of 1 ms of it, a queue of 20 ms), behind netem's
        delay when given."""
        bits = rate_bits(self.rate)
        burst = max(32 << 10, int(bits / 8 / 1000))
        tbf = ["tbf", "rate", self.rate, "burst", str(burst), "latency", "20ms"]
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        if delay:
            try:
                _sh(*tc, "root", "handle", "1:", "netem", "delay", delay, "limit", "100000")
            except RuntimeError as exc:
                raise RuntimeError(f"--delay needs tc's netem qdisc (kernel module "
                                   f"sch_netem), which this kernel lacks: {exc}") from None
            _sh(*tc, "parent", "1:1", "handle", "10:", *tbf)
        else:
            _sh(*tc, "root", "handle", "1:", *tbf)

    def _start_reaper(self) -> None:
        """A process that tears the cluster down when its creator dies without doing so:
        it waits for end of file on a pipe whose only writer is this process."""
        read, write = os.pipe()
        self._reaper = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "reap", self.prefix],
            stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
        os.close(read)
        self._reaper_pipe = write  # inherited by no child: os.pipe() fds are not inheritable

    def down(self) -> None:
        """Kill what runs on the hosts and remove every trace of the cluster; idempotent."""
        if not self._built:
            return
        self._built = False
        teardown(self.prefix)
        if self._reaper is not None:
            os.close(self._reaper_pipe)
            try:
                self._reaper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
            self._reaper = None

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- use ------------------------------------------------------------------------
    def on_host(self, host: str, argv: list[str]) -> list[str]:
        """The argv that runs argv on host."""
        if host not in self.hosts:
            raise ValueError(f"no host {host}; the cluster has {', '.join(self.hosts)}")
        return [str(self.bin / "on-host"), host, *argv]

    def run(self, host: str, argv: list[str], env: dict[str, str] | None = None,
            timeout: float = 120, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run argv on host (in directory cwd); stdout and stderr merged; a timeout kills
        everything started on any host and fails with the output so far."""
        proc = subprocess.Popen(self.on_host(host, argv), env=env or self.env(), cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"timed out after {timeout} s: {' '.join(argv)}\n"
                                 f"--- output ---\n{out}") from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, None)

    def pids(self, host: str) -> list[int]:
        """Processes running in host's network namespace."""
        out = _sh("ip", "netns", "pids", self.netns(host), check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> None:
        for host in self.hosts:
            _kill(self.pids(host))

    def link_bytes(self) -> dict[str, int]:
        """Bytes each host has sent over its link so far (tc's count at its eth0)."""
        return {host: _qdisc_bytes(self.netns(host), "eth0") for host in self.hosts}

    def set_link(self, host: str, up: bool) -> None:
        """Pull (or put back) host's cable: its bridge port goes down, so no packet
        reaches or leaves it, and ssh to or from it fails (bin/ssh)."""
        port = f"p{self.hosts.index(host) + 1}"
        _sh("ip", "-n", self.bridge, "link", "set", port, "up" if up else "down")
        marker = self.state / "hosts" / host / "down"
        if not up:
            marker.touch()
            return
        # Back up: wait for the carrier, and forget the neighbours that failed meanwhile
        # (else connecting fails at once with "no route to host" until they time out).
        deadline = time.monotonic() + 5
        while "LOWER_UP" not in _sh("ip", "-n", self.netns(host), "link", "show", "eth0").stdout \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        for name in self.hosts:
            _sh("ip", "-n", self.netns(name), "neigh", "flush", "all", check=False)
        marker.unlink(missing_ok=True)

    def ssh_log(self) -> str:
        return (self.state / "ssh.log").read_text()


def _qdisc_bytes(ns: str, dev: str) -> int:
    out = _sh("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev).stdout
    sent = [int(b) for b in re.findall(r"Sent (\d+) bytes", out)]
    return sent[0] if sent else 0  # the root qdisc's count comes first


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def teardown(prefix: str) -> None:
    """Remove the cluster ``prefix``: processes, namespaces, state. Safe to repeat."""
    state = ROOT / prefix
    names = [n for n in _netns_names() if n.startswith(prefix + "-")]
    for _ in range(3):  # a process being started in a namespace may appear meanwhile
        pids = [int(p) for n in names for p in
                _sh("ip", "netns", "pids", n, check=False).stdout.split()]
        if not pids:
            break
        _kill(pids)
        time.sleep(0.2)
    for name in names:
        _sh("ip", "netns", "del", name, check=False)
    hosts = state / "hosts"
    if hosts.is_dir():
        for home in hosts.iterdir():
            uts = home / "uts"
            if uts.exists():
                _sh("umount", "-l", str(uts), check=False)
    shutil.rmtree(state, ignore_errors=True)


def _netns_names() -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup_stale() -> list[str]:
    """Tear down every cluster whose creator has died; returns their prefixes."""
    prefixes = {n.split("-")[0] for n in _netns_names() if PREFIX_RE.match(n.split("-")[0])}
    if ROOT.is_dir():
        prefixes |= {p.name for p in ROOT.iterdir() if PREFIX_RE.match(p.name)}
    stale = []
    for prefix in sorted(prefixes):
        try:
            pid, started = (ROOT / prefix / "owner").read_text().split()
        except (OSError, ValueError):
            pid, started = PREFIX_RE.match(prefix)[1], "?"
        alive = _start_time(int(pid))
        if alive is None or (started != "?" and alive != started):
            teardown(prefix)
            stale.append(prefix)
    return stale


def _reap(prefix: str) -> None:
    """Wait until the creator's pipe closes (it ended, however), then tear down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.buffer.read()
    teardown(prefix)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="build a cluster, run CMD on h1, tear it down")
    run.add_argument("--hosts", type=int, default=2)
    run.add_argument("--rate", default="1gbit", help="link rate (tc units), default 1gbit")
    run.add_argument("--delay", help="netem delay added at each host's egress, e.g. 1ms")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    sub.add_parser("cleanup", help="remove what killed runs left behind")
    reap = sub.add_parser("reap")
    reap.add_argument("prefix")
    args = parser.parse_args(argv)
    if args.what == "reap":
        _reap(args.prefix)
        return 0
    if args.what == "cleanup":
        for prefix in cleanup_stale():
            print(f"removed {prefix}")
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("run: a command is required")
    with Cluster(args.hosts, args.rate, args.delay) as cluster:
        before = cluster.link_bytes()
        code = subprocess.call(cluster.on_host("h1", cmd), env=cluster.env(
            HOROVODISH_CLUSTER_HOSTS=",".join(cluster.hosts),
            HOROVODISH_CLUSTER_STATE=str(cluster.state)))
        after = cluster.link_bytes()
        print("link bytes sent: " + ", ".join(
            f"{h} {after[h] - before[h]}" for h in cluster.hosts), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
