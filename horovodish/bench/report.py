"""The bench's printed table, its JSON and its plot."""
from __future__ import annotations

import json

from .environment import describe


def print_report(size: int, figures: dict) -> None:
    rows = figures["allreduce"]
    paths = list(rows[0]["paths"]) if rows else []
    print(f"horovodish.bench: {size} ranks, float32 Sum allreduce, synchronous; each path's "
          "time in us and its ratio to MPI_Allreduce (MPI's time / the path's: above 1 is "
          "faster)")
    mode = figures.get("sharing")
    if mode:
        print(f"machine mode: writing shared memory another core has just read took "
              f"{mode['before']:.1f}x a plain write before this run, {mode['after']:.1f}x "
              "after (about 3x: the two cores share an L3; 10x and more: they do not, and "
              "every shared-memory transfer, MPI's too, is slow: docs/tuning.md)")
    if "huge_pages" in figures:
        print(describe(figures["huge_pages"]))
    header = f"{'bytes':>10} {'MPI us':>9} " + " ".join(f"{p[:24]:>30}" for p in paths)
    print(header)
    for row in rows:
        cells = " ".join(f"{row['paths'][p]['seconds'] * 1e6:>21.1f} ({row['paths'][p]['ratio_to_mpi']:5.2f}x)"
                         for p in paths)
        print(f"{row['bytes']:>10} {row['mpi_s'] * 1e6:>9.1f} {cells}")
    small = figures["many_small"]
    print(f"\n{small['count']} x {small['bytes_each'] >> 10} KiB async then synchronized; one "
          f"MPI_Allreduce of the concatenation {small['mpi_one_call_s'] * 1e3:.2f} ms, "
          f"{small['count']} separate MPI calls {small['mpi_separate_s'] * 1e3:.2f} ms")
    for path, values in small["paths"].items():
        per_round = values["over_one_call_per_round"]
        print(f"  {path:28s} {values['seconds'] * 1e3:7.2f} ms  {values['over_one_call']:5.2f}x "
              f"one call (rounds {min(per_round):.2f}x to {max(per_round):.2f}x), "
              f"{values['over_separate']:5.2f}x separate calls")
    print(f"  timeline on: {small['runtime_with_timeline_s'] * 1e3:.2f} ms "
          f"({small['timeline_throughput_loss_percent']:.1f}% less throughput)")
    if figures.get("collectives"):
        from .collectives import print_rows
        print_rows(figures["collectives"])
    step = figures.get("training")
    if step:
        print(f"\ntraining step, MLP {'-'.join(map(str, step['widths']))}, batch "
              f"{step['batch_per_rank']} per rank, {step['threads']} torch thread(s) per rank:")
        for key, value in step["steps_per_s"].items():
            print(f"  {key:34s} {value:8.1f} steps/s")
        print(f"  horovodish / DDP: {step['over_ddp']:.2f}x; of the no-communication bound: "
              f"horovodish {step['ours_over_bound']:.2f}, DDP {step['ddp_over_bound']:.2f}")
        phases = step["phases_s"]
        print("  our step: " + ", ".join(f"{k.replace('_', ' ')} {v * 1e3:.2f} ms"
                                         for k, v in phases.items()))
        print("  forward backward by rank: " + ", ".join(
            f"{v * 1e3:.2f}" for v in step.get("forward_backward_by_rank_s", [])) + " ms")
    jax_step = figures.get("jax_training")
    if jax_step:
        print(f"\nJAX training step, MLP {'-'.join(map(str, jax_step['widths']))}, batch "
              f"{jax_step['batch_per_rank']} per rank:")
        for key, value in jax_step["steps_per_s"].items():
            print(f"  {key:34s} {value:8.1f} steps/s")
        low, high = jax_step["over_jax_range"]
        print(f"  horovodish / jax.distributed: {jax_step['over_jax']:.2f}x (rounds {low:.2f}x "
              f"to {high:.2f}x); of the no-communication bound: horovodish "
              f"{jax_step['ours_over_bound']:.2f}, jax.distributed "
              f"{jax_step['jax_over_bound']:.2f}")
    many = figures.get("many_tensors")
    if many:
        print(f"\nmany-tensor step, {many['parameter_tensors']} parameter tensors, batch "
              f"{many['batch_per_rank']} per rank, one torch thread per rank, plain SGD:")
        _print_many(many, {"horovodish DistributedOptimizer": "horovodish",
                           "torch DDP (gloo)": "torch DDP (gloo)"})
        print("  sharded (ZeRO stage 2) against DDP with torch's ZeroRedundancyOptimizer:")
        _print_many(many["sharded"], {"horovodish DistributedOptimizer": "horovodish sharded",
                                      "torch DDP (gloo)": "DDP + ZeroRedundancyOptimizer"})
    if figures.get("per_call"):
        from .per_call import print_rows as print_per_call
        print_per_call(figures["per_call"], "gloo")
    if figures.get("cache_misses"):
        misses = figures["cache_misses"]
        print(f"\nslow-path cycles in each of {misses['steps']} steps (bench/cache_misses.py):")
        for name in misses["total_after_first_step"]:
            print(f"  {name.replace('_', ' '):34s} {misses[name]}")
        cost = misses.get("miss_cost")
        if cost:
            print(f"  one 4-byte synchronous allreduce: {cost['uncached_us']:.0f} us under a "
                  f"new name each call (a cache miss), {cost['cached_us']:.0f} us cached, "
                  f"MPI_Allreduce {cost['mpi_us']:.0f} us (median per call)")
    if figures.get("negotiation"):
        print("\nnegotiation, simulated ranks (bench/negotiation.py): rank 0's Python work "
              "per cycle, ms (modelled network ms)")
        for row in figures["negotiation"]["rows"]:
            print(f"  {row['ranks']:>5} ranks x {row['tensors']} tensors, "
                  f"{row['scenario']:<30} {row['work_ms']:7.2f} ({row['model_network_ms']:.2f})")
    idle = figures["idle"]
    print(f"\nidle cost: the idle runtime thread uses {idle['runtime_thread_cpu_percent']:.2f}% "
          f"of a core while a compute-bound loop runs; the loop runs "
          f"{idle['slowdown_percent']:.2f}% slower (median of {idle['rounds']} rotating "
          f"rounds; noise floor: the loop against itself, runtime off, differs by "
          f"{idle['noise_floor_percent']:.2f}% in a median round, "
          f"{idle['control_median_percent']:+.2f}% in the median)")


def _print_many(row: dict, labels: dict[str, str]) -> None:
    for key, value in row["ms_per_step"].items():
        low, high = row["ms_per_step_range"][key]
        print(f"  {labels.get(key, key):34s} {value:7.2f} ms per step ({low:.2f} to {high:.2f})")
    for key, value in row["added_us_per_tensor"].items():
        low, high = row["added_us_per_tensor_range"][key]
        print(f"  host time {labels[key]} adds per parameter tensor: {value:6.2f} us "
              f"({low:.2f} to {high:.2f})")
    low, high = row["ours_added_over_ddp_added_range"]
    print(f"  horovodish's added time / the other's: {row['ours_added_over_ddp_added']:.2f}x "
          f"({low:.2f} to {high:.2f} over rounds)")


def write_json(path: str, figures: dict) -> None:
    with open(path, "w") as handle:
        json.dump(figures, handle, indent=2)


def plot(rows: list[dict], path: str) -> None:
    """Bus bandwidth against size: every path, and MPI."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = [r["bytes"] for r in rows]
    plt.figure(figsize=(8, 4.5))
    for name in rows[0]["paths"]:
        plt.plot(sizes, [r["paths"][name]["busbw"] / 1e9 for r in rows], "o-", label=name)
    plt.plot(sizes, [r["mpi_busbw"] / 1e9 for r in rows], "s--", color="black",
             label="MPI_Allreduce")
    plt.xscale("log", base=2)
    plt.xlabel("bytes")
    plt.ylabel("bus bandwidth (GB/s)")
    plt.legend(fontsize=8)
    plt.grid(alpha=0.3)
    plt.tight_layout()
    plt.savefig(path)
