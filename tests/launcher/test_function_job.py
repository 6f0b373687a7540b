"""horovodish.run (Horovod's horovod.run): a function on every rank of a real job, under
mpirun and without it (--gloo), each rank's value back in rank order, checked against
what each rank must compute; a raising rank fails the call naming it and its error; an
elastic function job is refused; and the `horovod.run` of a Horovod script (through the
alias) runs unchanged."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import horovodish
from horovodish.compat import alias_path


@pytest.mark.parametrize("np,gloo", [(2, False), (3, True)])
def test_every_rank_s_value_in_rank_order(np, gloo):
    def sum_of_ranks(offset: float) -> tuple[int, int, float]:
        # defined here: cloudpickle sends it by value (a test module is not importable
        # in the ranks)
        import horovodish.torch as hvd
        import torch
        hvd.init()
        total = hvd.allreduce(torch.tensor([hvd.rank() + offset]), op=hvd.Sum).item()
        return hvd.rank(), hvd.size(), total
    results = horovodish.run(sum_of_ranks, args=(0.5,), np=np, use_gloo=gloo)
    want = sum(range(np)) + 0.5 * np
    assert results == [(rank, np, want) for rank in range(np)], results


def test_a_raising_rank_fails_the_call_with_its_error():
    def second_rank_raises() -> int:
        import horovodish.torch as hvd
        hvd.init()
        if hvd.rank() == 1:
            raise ValueError("rank one refuses")
        hvd.barrier()
        return hvd.rank()
    with pytest.raises(RuntimeError, match="rank 1 failed: ValueError: rank one refuses"):
        horovodish.run(second_rank_raises, np=2)


def test_an_elastic_function_job_is_refused():
    with pytest.raises(NotImplementedError, match="horovodishrun --min-np"):
        horovodish.run(print, np=2, min_np=1, max_np=2)


def test_a_horovod_script_s_horovod_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import horovod\n"
        "def main(scale):\n"
        "    import horovod.torch as hvd, torch\n"
        "    hvd.init()\n"
        "    return hvd.allgather(torch.tensor([hvd.rank() * scale])).tolist()\n"
        "if __name__ == '__main__':\n"
        "    print('RESULTS', horovod.run(main, args=(10,), np=2, hosts='localhost:2',\n"
        "                                 use_mpi=True))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [alias_path(), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert "RESULTS [[0, 10], [0, 10]]" in done.stdout, done.stdout + done.stderr
