"""ml_dtypes (bfloat16's numpy type, about 0.5 s of CPU to import) is loaded only when a
job first moves a bfloat16: a torch job that never does starts without it, and one that
does gets bfloat16 reduced as ever. Real ranks under the launcher."""
from __future__ import annotations

from pathlib import Path

from multirank import run_ranks

SCRIPT = """
import sys
import torch
import horovodish.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.full((5,), float(rank + 1)), op=hvd.Sum, name="plain")
assert torch.equal(total, torch.full((5,), float(size * (size + 1) // 2))), total
before = "ml_dtypes" in sys.modules
values = torch.tensor([0.5, -2.0, 3.0], dtype=torch.bfloat16) * (rank + 1)
summed = hvd.allreduce(values, op=hvd.Sum, name="half")
expected = torch.tensor([0.5, -2.0, 3.0]) * (size * (size + 1) // 2)
assert summed.dtype == torch.bfloat16 and torch.equal(summed.float(), expected), summed
print(f"rank {rank}: ml_dtypes before bfloat16 {before}, after {'ml_dtypes' in sys.modules}")
hvd.shutdown()
"""


def test_bfloat16_support_loads_when_first_used(tmp_path: Path):
    script = tmp_path / "lazy.py"
    script.write_text(SCRIPT)
    result = run_ranks(script, 2, timeout=120)
    assert result.returncode == 0, result.stdout
    for rank in range(2):
        assert f"rank {rank}: ml_dtypes before bfloat16 False, after True" in result.stdout, \
            result.stdout
