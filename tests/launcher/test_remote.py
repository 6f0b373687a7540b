"""The launcher's multi-host flags, without hosts: what reaches mpirun and ssh, and the
ssh check against stand-in ssh programs (tests/cluster runs them on emulated hosts)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from horovodish.launcher.cli import parse_args
from horovodish.launcher.hosts import parse_hosts
from horovodish.launcher.remote import (Remote, check_hosts, mpirun_args, rank_env,
                                        remote_hosts, uses_ssh)


def _remote(argv: list[str]) -> Remote:
    args = parse_args(["-np", "2", *argv, "p"])
    return Remote(args.ssh_port, args.ssh_identity_file, args.start_timeout,
                  args.network_interface or ())


def test_defaults_are_horovodrun_s():
    remote = _remote([])
    assert remote == Remote(None, None, 30.0, ())
    assert remote.ssh_options() == ["-o", "ConnectTimeout=30"]


def test_flags_reach_hydra_and_open_mpi():
    remote = _remote(["-p", "2222", "-i", "/k/id", "--start-timeout", "5",
                      "--network-interface", "eth1,ib0"])
    assert mpirun_args(remote, "mpich", True) == (
        ["-iface", "eth1"],
        {"HYDRA_LAUNCHER_EXTRA_ARGS": "-o ConnectTimeout=5 -p 2222 -i /k/id"})
    assert mpirun_args(remote, "openmpi", True) == (
        ["--mca", "btl_tcp_if_include", "eth1,ib0", "--mca", "oob_tcp_if_include", "eth1,ib0",
         "--mca", "plm_rsh_args", "-o ConnectTimeout=5 -p 2222 -i /k/id"], {})
    assert rank_env(remote) == {"FI_TCP_IFACE": "eth1", "NCCL_SOCKET_IFNAME": "eth1,ib0"}
    # One host: no ssh, nothing for it.
    assert mpirun_args(remote, "mpich", False) == (["-iface", "eth1"], {})
    assert rank_env(_remote([])) == {}


def test_remote_hosts_leave_this_one_out():
    import socket
    hosts = parse_hosts(f"localhost:1,{socket.gethostname()}:2,a:1,b,a:3")
    assert remote_hosts(hosts) == ["a", "b"]
    assert remote_hosts(None) == []


@pytest.mark.parametrize("mpi_args, environ, expected", [
    ([], {}, True),
    (["-launcher", "ssh"], {}, True),
    (["-launcher", "slurm"], {}, False),
    (["-bootstrap"], {}, False),
    ([], {"HYDRA_LAUNCHER": "fork"}, False),
    ([], {"SLURM_JOB_ID": "7"}, False),
    (["-launcher", "rsh"], {"SLURM_JOB_ID": "7"}, True),
])
def test_the_check_only_for_ssh_launches(mpi_args, environ, expected):
    assert uses_ssh(mpi_args, environ) is expected


def _fake_ssh(tmp_path: Path, body: str) -> str:
    script = tmp_path / "ssh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_check_names_each_host_that_fails_and_why(tmp_path):
    log = tmp_path / "calls"
    ssh = _fake_ssh(tmp_path, f'''echo "$@" >> {log}
for last; do :; done
case "$*" in
  *" good true") exit 0 ;;
  *" bad true") echo "Permission denied (publickey)." >&2; exit 255 ;;
  *" slow true") sleep 30 ;;
esac
''')
    start = time.monotonic()
    problems = check_hosts(["good", "bad", "slow"], Remote(2222, "/id", 1.5), ssh=ssh)
    assert time.monotonic() - start < 6, "the hosts are checked at once, within the timeout"
    assert problems == [
        "bad: ssh failed: Permission denied (publickey).",
        "slow: no answer over ssh within the start timeout (1.5 s; --start-timeout)"]
    calls = sorted(log.read_text().splitlines())
    assert calls[0].startswith("-o BatchMode=yes -o StrictHostKeyChecking=no "
                               "-o ConnectTimeout=1 -p 2222 -i /id "), calls
    assert check_hosts(["good"], Remote(), ssh=ssh) == []


def test_a_host_that_comes_up_late_is_tried_again_until_the_start_timeout(tmp_path):
    """Kubernetes' pods (their names, their sshd) come up in any order: ssh's exit code
    255 is retried every second; the host that answers in time passes, the one that
    never does is named with ssh's last word, within the timeout."""
    up_at = time.time() + 2
    ssh = _fake_ssh(tmp_path, f'''for last; do :; done
case "$*" in
  *" late true") [ "$(date +%s)" -ge {int(up_at) + 1} ] && exit 0
                 echo "ssh: Could not resolve hostname late: Name or service not known" >&2
                 exit 255 ;;
  *" never true") echo "ssh: connect to host never port 22: Connection refused" >&2
                  exit 255 ;;
  *" broken true") echo "bash: true: command not found" >&2; exit 127 ;;
esac
''')
    start = time.monotonic()
    problems = check_hosts(["late", "never", "broken"], Remote(None, None, 6), ssh=ssh)
    elapsed = time.monotonic() - start
    assert problems == ["never: ssh failed: ssh: connect to host never port 22: "
                        "Connection refused",
                        "broken: ssh failed: bash: true: command not found"]
    assert 4 <= elapsed < 8, elapsed


def test_the_launcher_stops_before_mpirun_when_a_host_fails(tmp_path, monkeypatch, capsys):
    ssh = _fake_ssh(tmp_path, 'echo "ssh: Could not resolve hostname nohost: Name or '
                              'service not known" >&2; exit 255\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    from horovodish.launcher import run as run_mod
    code = run_mod.main(["-np", "2", "-H", "localhost:1,nohost:1", "--start-timeout", "2",
                         "python", "-c", "pass"])
    assert code == 255
    err = capsys.readouterr().err
    assert err.strip() == ("horovodishrun: cannot start the job: nohost: ssh failed: ssh: "
                           "Could not resolve hostname nohost: Name or service not known")


@pytest.mark.parametrize("caller_args", [None, "--external-launcher"])
def test_no_ssh_options_reach_a_scheduler_s_launcher(monkeypatch, caller_args):
    """Inside a Slurm allocation Hydra starts its proxies with srun and hands it
    HYDRA_LAUNCHER_EXTRA_ARGS: ssh's ``-o ConnectTimeout=30`` there would make srun write
    the job's output to a file of that name. What the caller (or Slurm) put there stays."""
    from horovodish.launcher import run as run_mod
    started: list[dict[str, str]] = []
    monkeypatch.setattr(run_mod, "run_job", lambda argv, env: started.append(env) or 0)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    if caller_args is None:
        monkeypatch.delenv("HYDRA_LAUNCHER_EXTRA_ARGS", raising=False)
    else:
        monkeypatch.setenv("HYDRA_LAUNCHER_EXTRA_ARGS", caller_args)
    code = run_mod.main(["-np", "2", "-H", "nodea:1,nodeb:1", "-p", "2222", "python", "-c",
                         "pass"])
    assert code == 0 and len(started) == 1
    assert started[0].get("HYDRA_LAUNCHER_EXTRA_ARGS") == caller_args
