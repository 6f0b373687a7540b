"""horovodish with ``torch.compile`` (tested with torch 2.13 on CPU).

* ``DistributedOptimizer`` works with a compiled model as it stands: its hooks run in
  the autograd engine, outside any graph. But a model compiled whole runs its backward
  as one graph, so every gradient is final at its very end and nothing overlaps.
  ``torch.compile(model, backend=hvd.compile_backend())`` cuts the graph where
  parameters reach the bucket size, as dynamo does for DDP models (its DDPOptimizer),
  and compiles each piece with ``backend``: gradients of the last pieces are reduced
  while the backward of the first still runs.
* Collectives are never traced: dynamo is told to skip horovodish, as it skips numpy, so
  a collective called inside a compiled function is a graph break and runs eagerly
  (correct, but the graph is cut there). With ``fullgraph=True`` dynamo refuses it
  ("Attempted to call function marked as skipped ... Avoid calling the function
  `allreduce`"): call collectives outside the compiled function.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Callable

# Where dynamo keeps the modules it does not trace: trace_rules from torch 2.2, skipfiles
# before (both have add(module_name)).
_RULE_MODULES = ("torch._dynamo.trace_rules", "torch._dynamo.skipfiles")


def compile_backend(bucket_cap_mb: float = 25.0, backend: str | Callable[..., Any] = "inductor"
                    ) -> Callable[..., Any]:
    """A ``torch.compile`` backend that keeps reductions overlapping backward: the graph
    is cut into pieces of about ``bucket_cap_mb`` of parameters, in reverse order of use
    (DistributedOptimizer's learned buckets follow that order), each compiled with
    ``backend`` (a name, as in ``torch.compile(backend=...)``, or a callable). Modes
    (``mode="reduce-overhead"``) apply to torch.compile's own inductor only."""
    from torch._dynamo.backends.distributed import DDPOptimizer
    from torch._dynamo.backends.registry import lookup_backend
    cap = max(1, int(bucket_cap_mb * 2 ** 20))
    compile_fn = lookup_backend(backend) if isinstance(backend, str) else backend
    return DDPOptimizer(cap, compile_fn, first_bucket_cap=cap).compile_fn


def _skip_horovodish(trace_rules: Any) -> None:
    add = getattr(trace_rules, "add", None)
    if add is not None:
        add("horovodish")


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Runs _skip_horovodish once dynamo's trace rules are imported: importing them
    ourselves would cost every rank seconds at start, compiling or not."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _RULE_MODULES:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_skip(module: Any) -> None:
            exec_module(module)
            _skip_horovodish(module)
        spec.loader.exec_module = exec_and_skip  # type: ignore[method-assign]
        return spec


def keep_collectives_out_of_graphs() -> None:
    """Make dynamo skip horovodish now, or as soon as it is imported."""
    loaded = [sys.modules[name] for name in _RULE_MODULES if name in sys.modules]
    if loaded:
        _skip_horovodish(loaded[0])
    elif not any(isinstance(f, _WhenDynamoLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenDynamoLoads())
