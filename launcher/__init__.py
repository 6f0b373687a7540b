"""horovodish.launcher: ``horovodishrun``, a thin, shell-free front end to ``mpirun``.

It exists so users get Horovod's familiar ``horovodrun -np 4 python train.py`` while the
actual process management stays with the MPI installation (MPICH Hydra or Open MPI).
See :mod:`horovodish.launcher.run` for the contract.
"""
