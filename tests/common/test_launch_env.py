"""Which launcher started a process, from its environment alone
(horovodish/common/world/launch_env.py): the variables each launcher really sets."""
from __future__ import annotations

from horovodish.common.world.launch_env import (SLURM_PORT_BASE, SLURM_PORT_SPAN,
                                                 SLURM_PORT_TRIES, detect, expand_hostlist,
                                                 missing_variables)

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0", "MASTER_ADDR": "h1", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}
SRUN = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
        "SLURM_STEP_NODELIST": "h[1-2]", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0",
        "SLURM_LOCALID": "1"}


def test_an_mpi_process_manager_wins_over_everything():
    for variable in ("PMI_FD", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"):
        assert detect({**TORCHRUN, **SRUN, variable: "0"}) is None


def test_torchrun_with_its_agent_store_and_restart_count():
    launch = detect(TORCHRUN)
    assert (launch.kind, launch.rank, launch.size) == ("torchrun", 1, 4)
    assert (launch.master_addr, launch.ports, launch.agent_store) == ("h1", (29500,), True)
    assert launch.run_id == "job7.2"
    restarted = detect({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "3"})
    assert restarted.job_key() != launch.job_key()


def test_a_slurm_step_without_pmi():
    launch = detect(SRUN)
    assert (launch.kind, launch.rank, launch.size, launch.master_addr) == \
        ("slurm", 3, 4, "h1")
    assert len(launch.ports) == SLURM_PORT_TRIES
    assert SLURM_PORT_BASE <= launch.ports[0] < SLURM_PORT_BASE + SLURM_PORT_SPAN
    assert detect({**SRUN, "SLURM_STEP_ID": "1"}).ports != launch.ports
    assert detect({**SRUN, "MASTER_ADDR": "h2", "MASTER_PORT": "4000"}).ports == (4000,)
    batch_script = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert detect(batch_script) is None  # one task: no world to form


def test_a_bare_environment_and_a_driver():
    bare = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456"}
    launch = detect(bare)
    assert (launch.kind, launch.size, launch.master_addr, launch.ports) == \
        ("environment", 2, "10.0.0.1", (23456,))
    assert launch.job_key() == detect({**bare, "RANK": "1"}).job_key()
    assert detect({**bare, "HOROVODISH_SECRET": "s3"}).job_key() == "s3"
    driver = detect({"RANK": "1", "WORLD_SIZE": "2", "HOROVODISH_PMI_SERVER": "h:1",
                     "HOROVODISH_SECRET": "s"})
    assert (driver.kind, driver.server, driver.secret) == ("driver", "h:1", "s")
    assert detect({"WORLD_SIZE": "2"}) is None
    assert missing_variables({"WORLD_SIZE": "2"}) == ["RANK", "MASTER_ADDR", "MASTER_PORT"]
    assert missing_variables({}) == []


def test_slurm_host_lists():
    assert expand_hostlist("h1") == ["h1"]
    assert expand_hostlist("h[1-3,7]") == ["h1", "h2", "h3", "h7"]
    assert expand_hostlist("gpu[08-10],cpu1") == ["gpu08", "gpu09", "gpu10", "cpu1"]
    assert expand_hostlist("r[1-2]-n[1-2]") == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
