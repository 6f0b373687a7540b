"""What the launcher told this process: who started it, its rank, the job's size, and
where rank 0 can be found.

Read from the environment alone (no imports, no I/O), because ``horovodish/__init__``
asks it before anything imports ``mpi4py.MPI``: when no MPI process manager started the
job, MPI must not start before ``init()`` has found the job's PMI server. The order, the
first that applies:

1. an MPI process manager (``mpirun``, ``srun --mpi=pmi2``, the MPI Operator): ``None``,
   MPI forms the world itself, as always;
2. a driver that runs the PMI server itself (horovodishrun without mpirun, Ray, Spark):
   ``HOROVODISH_PMI_SERVER``, ``RANK``, ``WORLD_SIZE``;
3. torchrun / torch elastic: ``TORCHELASTIC_RUN_ID``, ``RANK``, ``WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT`` (the agent's store);
4. a Slurm step without PMI: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
   ``SLURM_STEP_NODELIST``, ``SLURM_JOB_ID``, ``SLURM_STEP_ID``;
5. a bare environment (Kubeflow's PyTorchJob, SageMaker, AzureML, Ray Train's
   TorchTrainer): ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.
"""
from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass
from typing import Mapping

# Set only in a process that an MPI process manager started (Hydra and srun's pmi2
# plugin: PMI_FD/PMI_RANK; Open MPI: OMPI_*; PMIx launchers: PMIX_RANK; MVAPICH: MV2_*).
MPI_MANAGER_VARIABLES = ("PMI_FD", "PMI_PORT", "PMI_RANK", "PMIX_RANK",
                         "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
SERVER_VARIABLE = "HOROVODISH_PMI_SERVER"
SECRET_VARIABLE = "HOROVODISH_SECRET"
RUN_ID_VARIABLE = "HOROVODISH_RUN_ID"
# Ports a Slurm step's rank 0 tries, derived from the job and step ids (below Linux's
# ephemeral range, so no outgoing connection holds one by chance); more than one, so a
# port that something else holds costs only a retry.
SLURM_PORT_BASE, SLURM_PORT_SPAN, SLURM_PORT_TRIES = 20000, 9000, 8


@dataclass(frozen=True)
class Launch:
    """How this process was started, when no MPI process manager started it."""

    kind: str            # "driver", "torchrun", "slurm" or "environment"
    launcher: str        # who that is, in words for messages
    rank: int
    size: int
    run_id: str          # the job (and its restart): a restarted group never meets the old one
    master_addr: str | None = None    # rank 0's host, as the other ranks reach it
    ports: tuple[int, ...] = ()       # rank 0's rendezvous port (candidates, in order)
    server: str | None = None         # a driver's PMI server, host:port
    secret: str | None = None         # given by the launcher (None: derived, see job_key)
    agent_store: bool = False         # torchrun's agent hosts a TCPStore at master

    def job_key(self) -> str:
        """The key every connection to the PMI server shows: the launcher's secret, or,
        where the launcher gave none, a digest of what identifies this job (it keeps
        other jobs and restarts apart; it is no secret from whoever can read the job's
        variables, as the launcher's own store is open to them)."""
        if self.secret:
            return self.secret
        text = "\0".join(("horovodish-pmi", self.kind, self.run_id, str(self.size)))
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def started_by_mpi(environ: Mapping[str, str]) -> bool:
    """Whether an MPI process manager started this process."""
    return any(variable in environ for variable in MPI_MANAGER_VARIABLES)


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def detect(environ: Mapping[str, str]) -> Launch | None:
    """The launch this environment describes, or None (an MPI process manager started
    the process, or nothing says it is one of several)."""
    if started_by_mpi(environ):
        return None
    rank, size = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    secret = environ.get(SECRET_VARIABLE) or None
    server = environ.get(SERVER_VARIABLE)
    if server and rank is not None and size is not None:
        return Launch("driver", environ.get("HOROVODISH_LAUNCHER", "the driver"), rank, size,
                      environ.get(RUN_ID_VARIABLE, server), server=server, secret=secret)
    master_addr = environ.get("MASTER_ADDR") or None
    master_port = _int(environ, "MASTER_PORT")
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id and rank is not None and size is not None and master_addr and master_port:
        restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return Launch("torchrun", "torchrun", rank, size, f"{run_id}.{restart}",
                      master_addr, (master_port,), secret=secret,
                      agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
    slurm = _slurm(environ, master_addr, master_port, secret)
    if slurm is not None:
        return slurm
    if rank is not None and size is not None and master_addr and master_port:
        run = environ.get(RUN_ID_VARIABLE) or f"{master_addr}:{master_port}"
        return Launch("environment", "the environment (RANK, WORLD_SIZE, MASTER_ADDR, "
                      "MASTER_PORT)", rank, size, run, master_addr, (master_port,),
                      secret=secret)
    return None


def _slurm(environ: Mapping[str, str], master_addr: str | None, master_port: int | None,
           secret: str | None) -> Launch | None:
    rank, size = _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_STEP_NUM_TASKS")
    nodes, job = environ.get("SLURM_STEP_NODELIST"), environ.get("SLURM_JOB_ID")
    step = environ.get("SLURM_STEP_ID")
    if rank is None or size is None or not nodes or not job or step is None:
        return None
    run_id = f"slurm-{environ.get('SLURM_CLUSTER_NAME', '')}-{job}.{step}." \
             f"{environ.get('SLURM_RESTART_COUNT', '0')}"
    if master_port:
        ports: tuple[int, ...] = (master_port,)
    else:
        first = SLURM_PORT_BASE + zlib.crc32(run_id.encode()) % SLURM_PORT_SPAN
        ports = tuple(range(first, first + SLURM_PORT_TRIES))
    return Launch("slurm", "Slurm's srun", rank, size, run_id,
                  master_addr or expand_hostlist(nodes)[0], ports, secret=secret)


def missing_variables(environ: Mapping[str, str]) -> list[str]:
    """Of a launcher's variables, those missing for a world to be formed (for the
    message of a refusal): torchrun's or the bare environment's set when some of it is
    there."""
    wanted = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not any(environ.get(name) for name in wanted):
        return []
    return [name for name in wanted if not environ.get(name, "").strip()]


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``h[1-3,7],gpu[01-02]-ib``) as host names."""
    names: list[str] = []
    for item in _split_top_level(text):
        names.extend(_expand_one(item))
    if not names:
        raise ValueError(f"empty Slurm host list {text!r}")
    return names


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:at])
            start = at + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.find("]", open_at)
    if close_at < 0:
        raise ValueError(f"unbalanced brackets in Slurm host list item {item!r}")
    head, body, tail = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    values = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ValueError(f"cannot read {part!r} in Slurm host list item {item!r}")
        low, high = match[1], match[2] or match[1]
        values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return [head + value + rest for value in values for rest in _expand_one(tail)]
