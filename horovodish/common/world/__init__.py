"""Forming the world: one MPI_COMM_WORLD whoever started the processes.

MPI's own process managers (mpirun, ``srun --mpi=pmi2``) hand each rank its world. Every
other launcher (torchrun, Kubeflow, Ray, Spark, a plain ``srun``, a bare ``RANK``/
``WORLD_SIZE`` environment) starts processes that know their rank and the job's size but
have no process manager. For those, a PMI-1 server of ours (``pmi_server``, in rank 0's
host or in a driver) takes the process manager's place, and each rank's MPICH starts as
its client (``membership``), so MPI still forms one world and the runtime above it runs
unchanged. ``launch_env`` reads what the launcher gave, ``rendezvous`` finds the server,
``mpi_start`` puts it together for ``init()``.
"""
