"""``python -m horovodish.bench.render``: put the latest records' figures into the docs.

A doc marks where a kind's table goes::

    <!-- records:bench -->
    (replaced by the table of the newest bench record)
    <!-- /records:bench -->

and this program rewrites what lies between the markers from the newest record of that
kind in the records folder (records.py). A block may show part of another kind's record
(``bench-jax``: the JAX step of the newest bench record; ``SOURCES``). ``--check`` changes nothing and exits 1 if a
doc is not what its records give (CI runs it, so the docs cannot drift from them).

    python -m horovodish.bench.render [--records docs/records] [--docs docs] [--check]
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from . import records

_BLOCK = re.compile(r"(<!-- records:(?P<kind>[\w-]+) -->\n)(?P<body>.*?)(<!-- /records:(?P=kind) -->)",
                    re.DOTALL)


def _source(record: dict[str, Any]) -> str:
    m = record["machine"]
    known = lambda value: value not in (None, "", "not recorded")  # noqa: E731
    hardware = [m.get("gpu"), m.get("cpu"),
                f"{m['cores']} cores" if known(m.get("cores")) else None,
                f"{m['memory_gib']} GiB" if known(m.get("memory_gib")) else None]
    versions = [f"{k} {' '.join(str(v).split())}" for k, v in m.get("versions", {}).items()
                if k in ("python", "torch", "tensorflow", "cupy", "nccl", "mpi4py", "mpi", "jax")
                and known(v)]
    commit = f", commit `{m['commit'][:10]}`" if known(m.get("commit")) else ""
    return (f"Measured {record['time'][:10]} on "
            f"{', '.join(h for h in hardware if known(h))} ({', '.join(versions)}){commit}, "
            f"with `{record['command']}`.\n")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _bench(record: dict[str, Any]) -> str:
    f = record["figures"]
    out = [_source(record), f"\n{f['ranks']} ranks. Allreduce, float32 Sum, synchronous: "
           "each path's time and its ratio to `MPI_Allreduce` (above 1 is faster).\n\n"]
    paths = list(f["allreduce"][0]["paths"]) if f.get("allreduce") else []
    out.append(_table(["bytes", "MPI µs", *paths], [
        [row["bytes"], f"{row['mpi_s'] * 1e6:.1f}",
         *(f"{row['paths'][p]['seconds'] * 1e6:.1f} ({row['paths'][p]['ratio_to_mpi']:.2f}×)"
           for p in paths)] for row in f.get("allreduce", [])]))
    small = f.get("many_small")
    if small:
        out.append(f"\n{small['count']} × {small['bytes_each'] >> 10} KiB submitted at once, "
                   "then synchronized, against one `MPI_Allreduce` of the concatenation "
                   f"({small['mpi_one_call_s'] * 1e3:.2f} ms):\n\n")
        out.append(_table(["path", "ms", "× one MPI call"], [
            [p, f"{v['seconds'] * 1e3:.2f}", f"{v['over_one_call']:.2f}"]
            for p, v in small["paths"].items()]))
    step = f.get("training")
    if step:
        widths = "-".join(map(str, step["widths"]))
        out.append(f"\nTraining step, MLP {widths}, batch {step['batch_per_rank']} per rank "
                   f"(horovodish / DDP: {step['over_ddp']:.2f}×):\n\n")
        out.append(_table(["contender", "steps/s"], [
            [k, f"{v:.1f}"] for k, v in step["steps_per_s"].items()]))
    if f.get("jax_training"):
        out.append("\n" + _jax_step(f["jax_training"]))
    many = f.get("many_tensors")
    if many:
        out.append(f"\nMany-tensor step ({many['parameter_tensors']} parameter tensors, batch "
                   f"{many['batch_per_rank']} per rank, plain SGD): ms per step and the host "
                   "time each reducer adds over the plain step, per parameter tensor "
                   "(medians over rounds; ranges in the record):\n\n")
        rows = []
        for label, row in (("replicated", many), ("sharded (against torch's "
                                                   "ZeroRedundancyOptimizer)", many["sharded"])):
            times, added = row["ms_per_step"], row["added_us_per_tensor"]
            ours, other = list(added)
            rows.append([label, f"{times['no communication']:.2f}", f"{times[other]:.2f}",
                         f"{times[ours]:.2f}", f"{added[other]:.1f}", f"{added[ours]:.1f}",
                         f"{row['ours_added_over_ddp_added']:.2f}"])
        out.append(_table(["optimizer", "plain ms", "DDP ms", "horovodish ms",
                           "DDP adds µs/tensor", "horovodish adds µs/tensor",
                           "horovodish's added / DDP's"], rows))
    cost = (f.get("cache_misses") or {}).get("miss_cost")
    if cost:
        shares = f" ({cost['unanimous_share']:.0%} of them answered by each rank alone, " \
            f"{cost['with_data_share']:.0%} with their data)" if "unanimous_share" in cost else ""
        out.append(f"\nA cache miss: a synchronous 4-byte allreduce under a new name each "
                   f"call takes {cost['uncached_us']:.0f} µs (a slow-path cycle each{shares}), "
                   f"under one name {cost['cached_us']:.0f} µs; `MPI_Allreduce` "
                   f"{cost['mpi_us']:.0f} µs.\n")
    idle = f.get("idle")
    if idle:
        out.append(f"\nIdle runtime: {idle['runtime_thread_cpu_percent']:.2f}% of a core; a "
                   f"compute-bound loop beside it {idle['slowdown_percent']:.2f}% slower "
                   f"(noise floor {idle['noise_floor_percent']:.2f}%).\n")
    return "".join(out)


def _jax_step(step: dict[str, Any]) -> str:
    widths = "-".join(map(str, step["widths"]))
    low, high = step["over_jax_range"]
    return (f"JAX training step, MLP {widths}, batch {step['batch_per_rank']} per rank "
            f"(horovodish / jax.distributed: {step['over_jax']:.2f}×, rounds {low:.2f}× to "
            f"{high:.2f}×):\n\n" + _table(["contender", "steps/s"], [
                [k, f"{v:.1f}"] for k, v in step["steps_per_s"].items()]))


def _bench_jax(record: dict[str, Any]) -> str:
    """The JAX step of a bench record, for docs/jax.md."""
    step = record["figures"].get("jax_training")
    if not step:
        return _source(record) + "\n(this record has no JAX training step)\n"
    return _source(record) + f"\n{record['figures']['ranks']} ranks. " + _jax_step(step)


def _horovod_suites(record: dict[str, Any]) -> str:
    f = record["figures"]
    rows = [[s["suite"], s["ranks"], s.get("keras", "Keras 3"), s["passed"], s["failed"],
             s["skipped"], "yes" if s.get("hung") else "no", f"{s['seconds']:.0f}",
             "; ".join(s.get("failures", [])) or "-"] for s in f["suites"]]
    return (_source(record) + f"\nHorovod {f.get('horovod', '?')}'s own suites, unchanged, "
            "through the `horovod` alias:\n\n" + _table(
                ["suite", "ranks", "Keras", "passed", "failed", "skipped", "hung", "s",
                 "failed tests"], rows))


def _horovod_examples(record: dict[str, Any]) -> str:
    f = record["figures"]
    runs = f["examples"]
    count = {kind: sum(r["result"] == kind for r in runs)
             for kind in ("passed", "failed", "skipped")}
    stack = ", ".join(f"{name} {f[key]}" for name, key in (
        ("torch", "torch"), ("torchvision", "torchvision"), ("TensorFlow", "tensorflow"))
        if f.get(key))
    ops = (" (torchvision's compiled operators do not load against this torch; their "
           "schemas were declared)" if f.get("torchvision_ops_declared") else "")

    def started(run: dict[str, Any]) -> str:
        if run["example"].startswith("ray/"):
            return "Ray (`horovod.ray`)"
        if not run.get("launcher", True):
            return "its own `horovod.run`"
        return "horovodishrun, elastic" if run.get("elastic") else "horovodishrun"
    rows = [[f"`{r['example']}`", f"`{r['args']}`" if r["args"] else "-", r["ranks"],
             started(r), r["result"], "-" if r["result"] == "skipped" else f"{r['seconds']:.0f}",
             (r.get("reason") or r.get("error") or "-").replace("|", "\\|")] for r in runs]
    return (_source(record) + f"\nHorovod {f.get('horovod', '?')}'s examples, unchanged, "
            f"through the `horovod` alias, with {stack}{ops}: {count['passed']} passed, "
            f"{count['failed']} failed, {count['skipped']} skipped.\n\n" + _table(
                ["example", "arguments", "ranks", "started as", "result", "s",
                 "error or reason"], rows))


def _horovod_examples_by_torch(folder: Path) -> str:
    """The newest examples record for each torch, newest torch first: one run per
    interpreter, and each keeps its table."""
    newest: dict[str, dict[str, Any]] = {}
    for record in records.load(folder, "horovod-examples"):
        newest[record["figures"].get("torch") or "none"] = record
    if not newest:
        return "(no horovod-examples record yet)\n"
    order = sorted(newest, key=lambda v: [int(n) for n in re.findall(r"\d+", v)], reverse=True)
    return "\n".join(_horovod_examples(newest[version]) for version in order)


def _gpu(record: dict[str, Any]) -> str:
    f = record["figures"]

    def cell(section: str, key: str, fmt: str = "{:.2f}") -> str:
        value = f.get(section, {}).get(key)
        return fmt.format(value) if isinstance(value, (int, float)) else "-"

    def met(section: str) -> str:
        figure = f.get(section, {})
        return "error" if "error" in figure else "met" if figure.get("met") else "not met"
    rows = [
        ["pack + unpack of ResNet-50's 161 gradients, share of device copy bandwidth",
         cell("fusion_kernel", "pack_unpack_fraction_of_copy_bandwidth"),
         cell("fusion_kernel", "target", "≥ {}"), met("fusion_kernel")],
        ["64 MiB allreduce, 20 in flight, over raw NCCL",
         cell("allreduce_64MiB", "runtime_in_flight_over_raw"),
         cell("allreduce_64MiB", "target", "≤ {}"), met("allreduce_64MiB")],
        ["ResNet-50 step, batch 32, DistributedOptimizer over plain torch",
         cell("resnet50_step", "distributed_over_plain", "{:.3f}"),
         cell("resnet50_step", "target", "≤ {}"), met("resnet50_step")],
        ["ResNet-50 step, batch 128, DistributedOptimizer over plain torch",
         cell("resnet50_step_batch128", "distributed_over_plain", "{:.3f}"),
         cell("resnet50_step_batch128", "target", "≤ {}"), met("resnet50_step_batch128")],
        ["host time of a synchronous allreduce of a CUDA tensor / a CPU tensor (µs)",
         f"{cell('host_costs_us', 'allreduce_cuda_tensor', '{:.1f}')} / "
         f"{cell('host_costs_us', 'allreduce_cpu_tensor', '{:.1f}')}", "-", "-"]]
    return (_source(record) + f"\n{f.get('ranks', 1)} rank(s) on {f.get('device', '?')}:\n\n"
            + _table(["figure", "value", "target", ""], rows))


def _gpu_history(folder: Path) -> str:
    rows = []
    for record in records.load(folder, "gpu"):
        f = record["figures"]
        rows.append([record["time"][:10], (record["machine"].get("commit") or "-")[:10],
                     *(f"{f.get(section, {}).get(key):.3f}"
                       if isinstance(f.get(section, {}).get(key), (int, float)) else "-"
                       for section, key in (
                           ("fusion_kernel", "pack_unpack_fraction_of_copy_bandwidth"),
                           ("allreduce_64MiB", "runtime_in_flight_over_raw"),
                           ("resnet50_step", "distributed_over_plain"),
                           ("resnet50_step_batch128", "distributed_over_plain")))])
    return "Every GPU record, oldest first:\n\n" + _table(
        ["date", "commit", "kernel share of copy bandwidth", "64 MiB in flight / raw",
         "ResNet-50 b32 / plain", "ResNet-50 b128 / plain"], rows)


# The figures the bench's targets are about, where a record holds them, and the target
# at each number of ranks that has one.
_TARGETS: tuple[tuple[str, tuple[str, ...], dict[int, str]], ...] = (
    ("MLP step, DDP's time / ours", ("training", "over_ddp"), {2: "≥ 1.5"}),
    ("162 tensors: our added host time / DDP's",
     ("many_tensors", "ours_added_over_ddp_added"), {1: "≤ 0.5", 2: "≤ 0.6"}),
    ("the same, sharded / DDP + ZeroRedundancyOptimizer",
     ("many_tensors", "sharded", "ours_added_over_ddp_added"), {}),
    ("JAX step, jax.distributed's time / ours", ("jax_training", "over_jax"), {2: "≥ 1.5"}),
)


def _figure(figures: dict[str, Any], path: tuple[str, ...]) -> float | None:
    for key in path:
        figures = figures.get(key) if isinstance(figures, dict) else None
    return figures if isinstance(figures, (int, float)) else None


# The runs the summary of the bench history is over: the newest at each size, so that it
# says what the current code gives, while no single run decides.
SUMMARY_RUNS = 3


def _bench_history(folder: Path) -> str:
    """Every bench run's target figures, then their median and range over the newest
    runs at each rank count: a figure of a shared VM moves from run to run, and a target
    holds on the median."""
    runs = records.load_bench_runs(folder)
    rows = [[r["time"][:16].replace("T", " "), r["figures"].get("ranks", "?"),
             (r["machine"].get("commit") or "-")[:10],
             *(f"{v:.2f}" if (v := _figure(r["figures"], path)) is not None else "-"
               for _, path, _ in _TARGETS),
             " / ".join(f"{v * 1e3:.1f}" for v in r["figures"].get("training", {}).get(
                 "forward_backward_by_rank_s", [])) or "-"] for r in runs]
    out = ["Every bench run, oldest first:\n\n", _table(
        ["run (UTC)", "ranks", "commit", *(label for label, _, _ in _TARGETS),
         "MLP forward+backward by rank (ms)"], rows)]
    summary = []
    for ranks in sorted({r["figures"].get("ranks", 0) for r in runs}):
        at = [r["figures"] for r in runs if r["figures"].get("ranks", 0) == ranks]
        at = at[-SUMMARY_RUNS:]
        for label, path, target in _TARGETS:
            values = sorted(v for f in at if (v := _figure(f, path)) is not None)
            if values:
                summary.append([ranks, label, len(values), f"{statistics.median(values):.2f}",
                                f"{values[0]:.2f} to {values[-1]:.2f}", target.get(ranks, "-")])
    out += [f"\nMedian and range over the newest {SUMMARY_RUNS} runs at each size:\n\n", _table(
        ["ranks", "figure", "runs", "median", "range", "target"], summary)]
    return "".join(out)


def _against_ddp(record: dict[str, Any]) -> str:
    """A GPU record's comparison with torch DDP on NCCL (bench_gpu.py's against_ddp)."""
    f = record["figures"]
    section = f.get("against_ddp")
    if not section:
        return _source(record) + "\nThis record has no comparison with DDP.\n"
    if "error" in section:
        return _source(record) + f"\nThe comparison failed: {section['error']}\n"
    ours, bound = "horovodish DistributedOptimizer", "no communication"
    ddp = "torch DDP (nccl)"
    rows = []
    for name in ("resnet50_batch32", "resnet50_batch128", "many_tensors_batch32"):
        row = section.get(name, {})
        if "ms_per_step" not in row:
            rows.append([name, *["-"] * 6, row.get("error", "not measured")])
            continue
        step, added = row["ms_per_step"], row["added_us_per_tensor"]
        rows.append([name, f"{step[bound]:.2f}", f"{step[ddp]:.2f}", f"{step[ours]:.2f}",
                     f"{row['ours_over_ddp_step']:.3f}", f"{added[ddp]:.1f}",
                     f"{added[ours]:.1f}", "met" if row.get("met") else
                     ("not met" if "met" in row else "")])
    out = [_source(record), f"\n{f.get('ranks', 1)} rank(s) on {f.get('device', '?')}, "
           "one job, alternating rounds:\n\n",
           _table(["model", "plain ms", "DDP ms", "horovodish ms", "horovodish / DDP",
                   "DDP adds µs/tensor", "horovodish adds µs/tensor", "≤ 1.01 at b32"], rows)]
    calls = section.get("per_call", {}).get("rows", [])
    if calls:
        out.append("\nOne synchronous allreduce per call against "
                   "`torch.distributed.all_reduce` (below 1 is faster):\n\n")
        out.append(_table(["bytes", "horovodish µs", "torch.distributed µs", "completed",
                           "host time"], [
            [c["bytes"], f"{c['ours_s'] * 1e6:.1f}", f"{c['theirs_s'] * 1e6:.1f}",
             f"{c['ours_over_theirs_s']:.2f}×",
             f"{c['ours_over_theirs_host_s']:.2f}×" if "ours_over_theirs_host_s" in c
             else "-"] for c in calls]))
    return "".join(out)


def _launchers(record: dict[str, Any]) -> str:
    f = record["figures"]
    rows = [[launcher, f"{row['allreduce_64mib_ms']:.2f}", f"{row['mpi_allreduce_64mib_ms']:.2f}",
             f"{row['mlp_steps_per_s']:.1f}", f"{row['mlp_over_ddp']:.2f}×"]
            for launcher, row in f["launchers"].items()]
    ratios = [[name, f"{r['allreduce_time']:.3f}", f"{r['mpi_allreduce_time']:.3f}",
               f"{r['mlp_step_rate']:.3f}"] for name, r in f["over_horovodishrun"].items()]
    return (_source(record) + f"\n{f['ranks']} ranks, median of {f['rounds']} jobs under each "
            "launcher, alternating.\n\n"
            + _table(["launcher", "64 MiB allreduce_ ms", "MPI_Allreduce ms",
                      "MLP steps/s", "MLP step against DDP (gloo)"], rows)
            + "\nOver horovodishrun's (mpirun's world):\n\n"
            + _table(["launcher", "allreduce_ time", "MPI_Allreduce time", "MLP step rate"],
                     ratios))


def _negotiation(record: dict[str, Any]) -> str:
    f = record["figures"]
    out = [_source(record), f"\nRank 0's Python work per cycle in ms (median of "
           f"{f['repeats']} fresh runs), and in brackets the network's part as modelled "
           f"(α = {f['alpha_us']:g} µs, {f['link_gbit_s']:g} Gbit/s links; see the model "
           "above). Steady is the fast path (every tensor a cache hit); one miss is one "
           "tensor whose shape changed, beside cache hits.\n"]
    eager = [row for row in f["rows"] if "model_without_ms" in row]
    for tensors in sorted({row["tensors"] for row in f["rows"] if row not in eager}):
        rows = [row for row in f["rows"] if row["tensors"] == tensors and row not in eager]
        sizes = sorted({row["ranks"] for row in rows})
        table = []
        for scenario in dict.fromkeys(row["scenario"] for row in rows):
            cells = {row["ranks"]: row for row in rows if row["scenario"] == scenario}
            table.append([scenario] + [
                f"{cells[n]['work_ms']:.2f} ({cells[n]['model_network_ms']:.2f})"
                if n in cells else "-" for n in sizes])
        out.append(f"\n{tensors} tensors:\n\n")
        out.append(_table(["cycle", *(f"{n:,} ranks" for n in sizes)], table))
    if eager:
        out.append(f"\n{eager[0]['scenario'].capitalize()} (the fast path with them "
                   "packed beside the bit vector, gathered and reduced at every rank): "
                   "rank 0's work, the exchange as modelled, the bit vector's allreduce "
                   "plus the scalars' own as modelled, and whether the default limit "
                   "across hosts lets them ride:\n\n")
        out.append(_table(
            ["ranks", "work ms", "gathered MB", "exchange ms", "without ms", "rides"],
            [[f"{row['ranks']:,}", f"{row['work_ms']:.2f}", f"{row['gathered_mb']:.2f}",
              f"{row['model_network_ms']:.2f}", f"{row['model_without_ms']:.2f}",
              "yes" if row["rides_by_default"] else "no"] for row in eager]))
    return "".join(out)


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _collectives(record: dict[str, Any]) -> str:
    f = record["figures"]
    sizes = sorted({row["bytes"] for row in f["rows"]})
    cells: dict[str, dict[int, str]] = {}
    for row in f["rows"]:
        for path, figures in row["paths"].items():
            first = row.get("first_over_later", {}).get(path)
            text = f"{figures['ratio_to_mpi']:.2f}"
            if first is not None:
                text += f" ({first:.1f}x)"
            cells.setdefault(f"{row['op']}: {path}", {})[row["bytes"]] = text
    first_mpi: dict[int, list[float]] = {}
    for row in f["rows"]:
        if "first_over_later" in row:
            first_mpi.setdefault(row["bytes"], []).append(row["first_over_later"]["MPI"])
    table = [[name, *(by_size.get(n, "-") for n in sizes)] for name, by_size in cells.items()]
    table.append(["MPI's own first call over its later ones (median over ops)",
                  *(f"({statistics.median(first_mpi[n]):.1f}x)" if n in first_mpi else "-"
                    for n in sizes)])
    text = (_source(record) + f"\n{f['ranks']} ranks, float32, median of {f['rounds']} "
            "alternating rounds. Each cell: MPI's call on numpy buffers (mpi4py, into a "
            "preallocated buffer, every page written) over the path's time, above 1 faster; in brackets the "
            "path's first call at that size (fresh tensor, fresh name) over its later "
            "calls.\n\n" + _table(["op: path", *map(_size, sizes)], table))
    fresh: dict[str, dict[int, str]] = {}
    for row in f["rows"]:
        for path, ratio in row.get("first_over_mpi_fresh", {}).items():
            fresh.setdefault(f"{row['op']}: {path}", {})[row["bytes"]] = f"{ratio:.2f}"
    if fresh:
        text += ("\nFirst calls of the out-of-place paths over the first call of MPI's "
                 "out-of-place form that allocates its output in the call (np.empty, as "
                 "a user of mpi4py at a new size): below 1 faster. Each comes right after "
                 "the rank wrote and freed memory of the output's size, so both find "
                 "memory this machine has just used.\n\n"
                 + _table(["op: path", *map(_size, sizes)],
                          [[name, *(by_size.get(n, "-") for n in sizes)]
                           for name, by_size in fresh.items()]))
    return text


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "negotiation": _negotiation,
    "collectives-2-ranks": _collectives, "collectives-3-ranks": _collectives,
    "bench": _bench, "horovod-suites": _horovod_suites, "gpu": _gpu, "bench-jax": _bench_jax,
    "gpu-against-ddp": _against_ddp, "gpu-against-ddp-2-ranks": _against_ddp,
    "launchers": _launchers}
# Blocks that show every record of some kinds.
HISTORIES: dict[str, Callable[[Path], str]] = {"gpu-history": _gpu_history,
                                              "bench-history": _bench_history,
                                              # the newest of each torch version
                                              "horovod-examples": _horovod_examples_by_torch}
# Blocks that show part of another kind's record: block name -> record kind.
SOURCES = {"bench-jax": "bench", "gpu-against-ddp": "gpu"}


def render_text(text: str, folder: Path) -> str:
    """``text`` with every marked block rewritten from its kind's newest record."""
    def block(match: re.Match) -> str:
        kind = match["kind"]
        if kind in HISTORIES:
            return match.group(1) + HISTORIES[kind](folder) + match.group(4)
        record = records.latest(folder, SOURCES.get(kind, kind))
        if kind not in RENDERERS:
            raise ValueError(f"no renderer for records of kind '{kind}'")
        body = RENDERERS[kind](record) if record else f"(no {kind} record yet)\n"
        return match.group(1) + body + match.group(4)
    return _BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench.render",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="docs/records")
    parser.add_argument("--docs", default="docs")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a doc differs from its records")
    args = parser.parse_args(argv)
    stale = []
    for doc in sorted(Path(args.docs).glob("*.md")):
        text = doc.read_text()
        new = render_text(text, Path(args.records))
        if new != text:
            stale.append(str(doc))
            if not args.check:
                doc.write_text(new)
    if args.check and stale:
        print("not what their records give (run python -m horovodish.bench.render): "
              + ", ".join(stale))
        return 1
    print(("checked: " if args.check else "rendered: ") + (", ".join(stale) or "no change"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
