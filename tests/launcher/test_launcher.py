"""Tests for horovodishrun: pure argv/env building, then real 2-rank jobs under mpirun."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from horovodish.launcher import mpirun as mpirun_mod
from horovodish.launcher import run as run_mod
from horovodish.launcher.cli import parse_args
from horovodish.launcher.command import build_command, child_env
from horovodish.launcher.envvars import config_env
from horovodish.launcher.hosts import hostfile_for, parse_hostfile, parse_hosts
from horovodish.launcher.process import exit_code
from multirank import assert_ok, run_ranks

LAUNCH = [sys.executable, "-m", "horovodish.launcher"]
# Ranks run unbuffered, so each line must be one write() or lines of two ranks can mix.
RANK_ENV = ("import os, sys; RANK = os.environ.get('PMI_RANK') or "
            "os.environ['OMPI_COMM_WORLD_RANK']; ")


def launch(args: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Run the launcher as a subprocess with captured text output and a timeout."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **kw.pop("env", {})}
    return subprocess.run(LAUNCH + args, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env, **kw)


# ---------------------------------------------------------------- flags -> environment

@pytest.mark.parametrize("flags, expected", [
    ([], {}),
    (["--fusion-threshold-mb", "32"], {"HOROVODISH_FUSION_THRESHOLD": str(32 * 1024 * 1024)}),
    (["--fusion-threshold-mb", "0.5"], {"HOROVODISH_FUSION_THRESHOLD": "524288"}),
    (["--fusion-threshold-mb", "0"], {"HOROVODISH_FUSION_THRESHOLD": "0"}),
    (["--cycle-time-ms", "2.5"], {"HOROVODISH_CYCLE_TIME": "2.5"}),
    (["--cycle-time-ms", "5"], {"HOROVODISH_CYCLE_TIME": "5"}),
    (["--cache-capacity", "0"], {"HOROVODISH_CACHE_CAPACITY": "0"}),
    (["--cache-capacity", "2048"], {"HOROVODISH_CACHE_CAPACITY": "2048"}),
    (["--disable-cache"], {"HOROVODISH_CACHE_CAPACITY": "0"}),
    (["--timeline-mark-cycles"], {"HOROVODISH_TIMELINE_MARK_CYCLES": "1"}),
    (["--stall-check-warning-time-seconds", "30"], {"HOROVODISH_STALL_CHECK_TIME_SECONDS": "30"}),
    (["--stall-check-shutdown-time-seconds", "1.5"],
     {"HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS": "1.5"}),
    (["--no-stall-check"], {"HOROVODISH_STALL_CHECK_DISABLE": "1"}),
    (["--autotune"], {"HOROVODISH_AUTOTUNE": "1"}),
    (["--log-level", "DEBUG"], {"HOROVODISH_LOG_LEVEL": "debug"}),
    (["--log-level", "trace"], {"HOROVODISH_LOG_LEVEL": "trace"}),
    (["--cpu-operations", "ring"], {"HOROVODISH_CPU_OPERATIONS": "ring"}),
    (["--cpu-operations", "SHM"], {"HOROVODISH_CPU_OPERATIONS": "shm"}),
    (["--gpu-operations", "NCCL"], {"HOROVODISH_GPU_OPERATIONS": "nccl"}),
    (["--hierarchical-allreduce"], {"HOROVODISH_HIERARCHICAL_ALLREDUCE": "1"}),
    (["--no-hierarchical-allreduce"], {"HOROVODISH_HIERARCHICAL_ALLREDUCE": "0"}),
    (["--hierarchical-allgather"], {"HOROVODISH_HIERARCHICAL_ALLGATHER": "1"}),
])
def test_flag_becomes_env_var(flags, expected):
    assert config_env(parse_args(["-np", "2", *flags, "python", "x.py"])) == expected


def test_cpu_operations_choices_match_the_runtime():
    from horovodish.common import config
    from horovodish.launcher import cli
    assert cli.CPU_OPERATIONS == config.CPU_OPERATIONS
    assert cli.GPU_OPERATIONS == config.GPU_OPERATIONS


def test_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = config_env(parse_args(["-np", "1", "--timeline-filename", "tl.json",
                                 "--autotune-log-file", "sub/at.csv", "prog"]))
    assert env == {"HOROVODISH_TIMELINE": str(tmp_path / "tl.json"),
                   "HOROVODISH_AUTOTUNE_LOG": str(tmp_path / "sub" / "at.csv")}
    # DYNAMIC is the timeline's mode, not a file in the working directory.
    env = config_env(parse_args(["-np", "1", "--timeline-filename", "DYNAMIC", "prog"]))
    assert env == {"HOROVODISH_TIMELINE": "DYNAMIC"}


def test_command_is_everything_after_the_flags():
    args = parse_args(["-np", "3", "python", "train.py", "-np", "7", "--verbose"])
    assert args.num_proc == 3 and not args.verbose
    assert args.command == ["python", "train.py", "-np", "7", "--verbose"]
    assert parse_args(["-np", "1", "--", "prog", "--x"]).command == ["prog", "--x"]


def test_config_wins_in_child_env():
    env = child_env({"HOROVODISH_CYCLE_TIME": "2"}, {"HOROVODISH_CYCLE_TIME": "9", "A": "b"})
    assert env == {"HOROVODISH_CYCLE_TIME": "2", "A": "b"}


# ---------------------------------------------------------------- argv for each flavour

CONFIG = {"HOROVODISH_CYCLE_TIME": "2", "HOROVODISH_AUTOTUNE": "1"}


def test_mpich_command():
    argv = build_command("/bin/mpirun", "mpich", 4, ["python", "t.py"], config=CONFIG,
                         hosts=parse_hosts("h1:2,h2:2"), mpi_args=["-bind-to", "core"],
                         environ={"HOROVOD_X": "1"})
    assert argv == ["/bin/mpirun", "-np", "4", "-hosts", "h1:2,h2:2",
                    "-genv", "HOROVODISH_CYCLE_TIME", "2", "-genv", "HOROVODISH_AUTOTUNE", "1",
                    "-bind-to", "core", "python", "t.py"]
    argv = build_command("mpirun", "mpich", 2, ["p"], hostfile="/tmp/hf")
    assert argv == ["mpirun", "-np", "2", "-f", "/tmp/hf", "p"]


def test_openmpi_command():
    environ = {"HOROVODISH_CYCLE_TIME": "9", "HOROVOD_TIMELINE": "t", "HOROVODISH_FOO": "x",
               "PATH": "/bin", "UNRELATED": "u"}
    argv = build_command("mpirun", "openmpi", 4, ["python", "t.py"], config=CONFIG,
                         hosts=parse_hosts("h1:2,h2"), mpi_args=["--bind-to", "none"],
                         environ=environ)
    assert argv == ["mpirun", "-np", "4", "--oversubscribe", "-H", "h1:2,h2",
                    "-x", "HOROVODISH_CYCLE_TIME=2", "-x", "HOROVODISH_AUTOTUNE=1",
                    "-x", "HOROVODISH_FOO", "-x", "HOROVOD_TIMELINE", "-x", "PATH",
                    "--bind-to", "none", "python", "t.py"]
    argv = build_command("mpirun", "openmpi", 2, ["p"], hostfile="/tmp/hf")
    assert argv == ["mpirun", "-np", "2", "--oversubscribe", "--hostfile", "/tmp/hf", "p"]


def test_mpi_args_are_split_not_shelled():
    args = parse_args(["-np", "2", "--mpi-args", "-bind-to core -map-by 'a b' $HOME;x", "p"])
    assert args.mpi_args == ["-bind-to", "core", "-map-by", "a b", "$HOME;x"]


def test_hosts_parsing():
    assert [(h.name, h.slots) for h in parse_hosts("a:2, b ,c:1")] == [
        ("a", 2), ("b", None), ("c", 1)]


HOSTFILE = "# cluster\nnode1 slots=2\nnode2:3   # comment\n\nnode3\n"


def test_hostfile_parsing():
    assert [(h.name, h.slots) for h in parse_hostfile(HOSTFILE)] == [
        ("node1", 2), ("node2", 3), ("node3", None)]


@pytest.mark.parametrize("flavour, text, converted", [
    ("mpich", HOSTFILE, "node1:2\nnode2:3\nnode3\n"),
    ("openmpi", HOSTFILE, "node1 slots=2\nnode2 slots=3\nnode3\n"),
    # Native already, but with comments Hydra refuses ("token # not supported"): rewritten.
    ("mpich", "a:2   # two slots\nb\n", "a:2\nb\n"),
    ("openmpi", "a slots=2\nb # one\n", "a slots=2\nb\n"),
])
def test_hostfile_conversion(tmp_path, flavour, text, converted):
    src = tmp_path / "hosts"
    src.write_text(text)
    path, temporary = hostfile_for(str(src), parse_hostfile(text), flavour)
    try:
        assert temporary and path != str(src) and Path(path).read_text() == converted
    finally:
        if temporary:
            os.unlink(path)


# ---------------------------------------------------------------- bad input -> exit 2

@pytest.mark.parametrize("argv, names", [
    (["-np", "0", "p"], "-np/--num-proc"),
    (["-np", "-1", "p"], "-np/--num-proc"),
    (["-np", "two", "p"], "-np/--num-proc"),
    (["p"], "-np/--num-proc"),
    (["-np", "2"], "command"),
    (["-np", "2", "--fusion-threshold-mb", "-1", "p"], "--fusion-threshold-mb"),
    (["-np", "2", "--fusion-threshold-mb", "big", "p"], "--fusion-threshold-mb"),
    (["-np", "2", "--cycle-time-ms", "nan", "p"], "--cycle-time-ms"),
    (["-np", "2", "--cache-capacity", "1.5", "p"], "--cache-capacity"),
    (["-np", "2", "--cache-capacity", "-3", "p"], "--cache-capacity"),
    (["-np", "2", "--stall-check-warning-time-seconds", "-5", "p"],
     "--stall-check-warning-time-seconds"),
    (["-np", "2", "--stall-check-shutdown-time-seconds", "x", "p"],
     "--stall-check-shutdown-time-seconds"),
    (["-np", "2", "--log-level", "loud", "p"], "--log-level"),
    (["-np", "2", "--cpu-operations", "nccl", "p"], "--cpu-operations"),
    (["-np", "2", "-H", "a:0", "p"], "-H/--hosts"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "p"], "--hostfile"),
    (["-np", "2", "--mpi-args", "'unbalanced", "p"], "--mpi-args"),
    (["-np", "2", "-H", "a", "--hostfile", "f", "p"], "not allowed with"),
    (["-np", "3", "-H", "a:1,b:1", "p"], "-np 3 needs 3 slots but -H/--hosts gives 2"),
    (["-np", "2", "--disable-cache", "--cache-capacity", "3", "p"], "not allowed with"),
    # elastic flags that cannot go together
    (["-np", "2", "--min-np", "3", "p"], "--min-np 3 is more than -np 2"),
    (["-np", "4", "--max-np", "3", "p"], "--max-np 3 is less than -np 4"),
    (["-np", "2", "-H", "a:2", "--host-discovery-script", "d.sh", "p"],
     "leave out -H/--hostfile"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "9", "1", "p"],
     "MIN 9 is more than MAX 1"),
    (["--max-np", "2", "p"], "needs -np or --min-np"),
    (["-np", "2", "--min-np", "1", "--reset-limit", "-1", "p"], "--reset-limit"),
    # horovodrun flags this launcher refuses, each saying why
    (["-np", "2", "--output-filename", "o", "p"], "give mpirun's own option with --mpi-args"),
    (["-np", "2", "--ssh-port", "70000", "p"], "--ssh-port"),
    (["-np", "2", "--start-timeout", "0", "p"], "--start-timeout"),
    (["-np", "2", "--network-interface", "eth0,,x", "p"], "--network-interface"),
    (["-np", "2", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "p"],
     "not allowed with"),
    (["-np", "2", "--config-file", "c.yaml", "p"], "HOROVODISH_* variables"),
])
def test_bad_arguments_exit_2(capsys, argv, names):
    with pytest.raises(SystemExit) as exc:
        run_mod.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and names in err, err


def test_slot_counts_limit_the_ranks(tmp_path, capsys):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=1\n")
    with pytest.raises(SystemExit) as exc:
        run_mod.main(["-np", "4", "--hostfile", str(hostfile), "p"])
    assert exc.value.code == 2
    assert "-np 4 needs 4 slots but --hostfile gives 3 (a:2, b:1)" in capsys.readouterr().err
    # Enough slots, or a host without a count (mpirun decides): accepted.
    for argv in (["-np", "3", "--hostfile", str(hostfile), "p"],
                 ["-np", "3", "-H", "a:1,b", "p"],
                 ["-np", "3", "-H", "a:1", "--mpi-args=--oversubscribe", "p"]):
        assert parse_args(argv).num_proc == 3


def test_version_and_flags_without_effect(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--version"])
    assert exc.value.code == 0
    from horovodish import __version__
    assert capsys.readouterr().out.strip() == f"horovodishrun {__version__}"
    args = parse_args(["-np", "2", "--mpi", "--mpi-threads-disable", "--mpi", "python", "x"])
    assert args.command == ["python", "x"] and config_env(args) == {}
    err = capsys.readouterr().err.splitlines()
    assert err == ["horovodishrun: --mpi has no effect (horovodish always runs on MPI)",
                   "horovodishrun: --mpi-threads-disable has no effect (the runtime asks MPI "
                   "for the thread level it needs)"], err


# ---------------------------------------------------------------- finding mpirun

def test_without_mpirun_the_launcher_starts_the_ranks_and_elastic_jobs_say_why_not(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(mpirun_mod, "locate", lambda *a, **k: None)
    script = tmp_path / "job.py"
    script.write_text("from horovodish.common import api\napi.init()\n"
                      "open(f'{__file__}.{api.rank()}.{api.size()}', 'w').close()\n")
    assert run_mod.main(["-np", "2", sys.executable, str(script)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py", "job.py.0.2",
                                                         "job.py.1.2"]
    assert run_mod.main(["-np", "2", "--min-np", "1", "python", "-c", "pass"]) == 127
    err = capsys.readouterr().err
    assert err.startswith("horovodishrun: no mpirun found; install one with: pip install mpich")


def _fake_exe(path: Path) -> Path:
    path.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    path.chmod(0o755)
    return path


def test_find_mpirun_order(tmp_path):
    empty, venv_bin, on_path = (tmp_path / d for d in ("empty", "bin", "path"))
    for d in (empty, venv_bin, on_path):
        d.mkdir()
    assert mpirun_mod.find_mpirun(exe_dir=empty, search_path=str(empty)) is None
    assert mpirun_mod.locate(exe_dir=str(empty), search_path="") is None
    fake = _fake_exe(on_path / "mpiexec")
    assert mpirun_mod.find_mpirun(exe_dir=empty, search_path=str(on_path)) == str(fake)
    first = _fake_exe(venv_bin / "mpirun")
    assert mpirun_mod.find_mpirun(exe_dir=venv_bin, search_path=str(on_path)) == str(first)
    assert mpirun_mod.locate(str(venv_bin), "").flavour == "mpich"


@pytest.mark.parametrize("text, flavour", [
    ("HYDRA build details:\n    Version: 4.2.0", "mpich"),
    ("mpirun (Open MPI) 4.1.5\n\nReport bugs to", "openmpi"),
    ("mpirun (Open MPI) 5.0.3", "openmpi"),
    ("mpirun (OpenRTE) 3.1.6", "openmpi"),
    ("something else", "unknown"),
])
def test_classify(text, flavour):
    assert mpirun_mod.classify(text) == flavour


def test_verbose_prints_command_and_exit_code_mapping(monkeypatch, capsys):
    monkeypatch.setattr(mpirun_mod, "locate", lambda *a, **k: mpirun_mod.MpiRun("/m/mpirun",
                                                                                "mpich"))
    seen = {}

    def fake_run_job(argv, env=None):
        seen["argv"], seen["env"] = argv, env
        return exit_code(-signal.SIGKILL)

    monkeypatch.setattr(run_mod, "run_job", fake_run_job)
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)  # the ranks get it then
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")  # theirs: left alone
    rc = run_mod.main(["-np", "2", "--verbose", "--autotune", "python", "a b.py"])
    assert rc == 128 + signal.SIGKILL
    expected = ["/m/mpirun", "-np", "2", "-genv", "THP_MEM_ALLOC_ENABLE", "1",
                "-genv", "HOROVODISH_AUTOTUNE", "1", "python", "a b.py"]
    assert seen["argv"] == expected and seen["env"]["HOROVODISH_AUTOTUNE"] == "1"
    assert capsys.readouterr().err.strip() == shlex.join(expected)


# ---------------------------------------------------------------- real jobs

def test_check_build():
    res = launch(["--check-build"], timeout=150)
    assert res.returncode == 0, res.stderr
    for needle in ("PyTorch", "TensorFlow", "Keras", "] MPI", "MPI library:", "mpirun:"):
        assert needle in res.stdout, res.stdout
    assert "[X] MPI library: MPICH" in res.stdout or "Open MPI" in res.stdout


def test_ranks_see_forwarded_env(tmp_path):
    code = RANK_ENV + ("import json; env = {k: v for k, v in os.environ.items() "
                       "if k.startswith('HOROVODISH_')}; "
                       "sys.stdout.write(json.dumps({'rank': RANK, **env}) + '\\n')")
    res = launch(["-np", "2", "--verbose", "--fusion-threshold-mb", "1", "--cycle-time-ms",
                  "2.5", "--cache-capacity", "7", "--timeline-filename", "tl.json",
                  "--timeline-mark-cycles", "--no-stall-check", "--autotune",
                  "--log-level", "debug", "--cpu-operations", "ring",
                  "--stall-check-warning-time-seconds", "9",
                  sys.executable, "-c", code],
                 cwd=tmp_path, env={"HOROVODISH_INHERITED": "yes"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "mpirun -np 2" in res.stderr  # --verbose
    seen = {d.pop("rank"): d for d in map(json.loads, res.stdout.splitlines())}
    expected = {"HOROVODISH_FUSION_THRESHOLD": "1048576", "HOROVODISH_CYCLE_TIME": "2.5",
                "HOROVODISH_CACHE_CAPACITY": "7",
                "HOROVODISH_TIMELINE": str(tmp_path / "tl.json"),
                "HOROVODISH_TIMELINE_MARK_CYCLES": "1", "HOROVODISH_STALL_CHECK_DISABLE": "1",
                "HOROVODISH_AUTOTUNE": "1", "HOROVODISH_LOG_LEVEL": "debug",
                "HOROVODISH_CPU_OPERATIONS": "ring",
                "HOROVODISH_STALL_CHECK_TIME_SECONDS": "9", "HOROVODISH_INHERITED": "yes"}
    assert seen == {"0": expected, "1": expected}


def test_exit_code_propagates():
    code = RANK_ENV + "import sys; sys.exit(3 if RANK == '1' else 0)"
    res = launch(["-np", "2", sys.executable, "-c", code])
    assert res.returncode != 0, res.stdout + res.stderr
    if mpirun_mod.locate().flavour == "mpich":
        assert res.returncode == 3  # Hydra passes the rank's code through


@pytest.mark.parametrize("where", ["hosts", "hostfile-slots", "hostfile-colon"])
def test_hosts_and_hostfile_run(tmp_path, where):
    if where == "hosts":
        flags = ["-H", "localhost:2"]
    else:
        hf = tmp_path / "hosts"
        hf.write_text("localhost slots=2\n" if where == "hostfile-slots" else "localhost:2\n")
        flags = ["--hostfile", str(hf)]
    code = RANK_ENV + "sys.stdout.write(f'rank {RANK}\\n')"
    res = launch(["-np", "2", *flags, sys.executable, "-c", code])
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.splitlines()) == ["rank 0", "rank 1"]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # zombie: waiting for init
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


@pytest.mark.parametrize("stubborn", [False, True])
def test_sigint_stops_every_rank(stubborn):
    """Ctrl-C on the launcher reaches the ranks; ranks ignoring it are killed after ~5 s."""
    code = ("import os, signal, time\n"
            + ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if stubborn else "")
            + "os.write(1, f'pid={os.getpid()};\\n'.encode())\ntime.sleep(60)\n")
    proc = subprocess.Popen(LAUNCH + ["-np", "2", sys.executable, "-c", code],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        pids = []
        deadline = time.monotonic() + 30
        while len(pids) < 2 and time.monotonic() < deadline:
            # mpirun merges the ranks' output: two lines can arrive glued together
            pids += [int(pid) for pid in re.findall(r"pid=(\d+);", proc.stdout.readline())]
        assert len(pids) == 2, "ranks did not start"
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
        assert rc == 128 + signal.SIGINT, rc  # as a shell reports a job Ctrl-C ended
        assert time.monotonic() - start < (10 if stubborn else 4)
        deadline = time.monotonic() + 5
        while not all(map(_dead, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(map(_dead, pids)), f"ranks {pids} survived"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.stdout.close()


# ---------------------------------------------------------------- tests/multirank.py

def test_run_ranks_helper(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(RANK_ENV + "sys.stdout.write(f'rank {RANK} {sys.argv[1:]} "
                      "{os.environ[\"EXTRA\"]} {os.environ[\"PYTHONUNBUFFERED\"]}\\n')\n")
    result = run_ranks(script, 2, args=["a", "b"], env={"EXTRA": "e"}, timeout=60)
    assert_ok(result)
    for rank in "01":
        assert f"rank {rank} ['a', 'b'] e 1" in result.stdout


def test_run_ranks_failure_and_timeout(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("print('about to fail'); raise SystemExit(5)\n")
    result = run_ranks(bad, 2, timeout=60)
    with pytest.raises(AssertionError, match="about to fail"):
        assert_ok(result)
    slow = tmp_path / "slow.py"
    slow.write_text("import time; print('started'); time.sleep(60)\n")
    start = time.monotonic()
    with pytest.raises(AssertionError, match="(?s)timed out.*started"):
        run_ranks(slow, 2, timeout=3)
    assert time.monotonic() - start < 20
