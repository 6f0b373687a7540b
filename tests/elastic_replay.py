"""Reading an elastic job's logs (tests/torch/workers/elastic_digits_worker.py) and
replaying what survived in one process: the independent reference for the elastic tests.

Why a replay: after a failure the job resumes from its last commit with another number of
ranks, so which samples made which step depends on when it failed. The worker logs every
step's indices on every rank; the steps that survived are those up to the commit each
next generation resumed from. One process then trains the same model on the same global
batches in the same order (float64, plain SGD with momentum on each batch's mean loss),
and the job's final weights must match it.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from multirank import assert_ranks_ok, import_worker

WORKER = Path(__file__).parent / "torch" / "workers" / "elastic_digits_worker.py"


@dataclass
class Generation:
    number: int
    size: int = 0
    resume_step: int = 0
    resume_seq: int = 0
    commits: list[dict] = field(default_factory=list)
    steps: dict[int, dict[int, list[int]]] = field(default_factory=dict)  # step -> rank -> indices
    epochs: dict[int, int] = field(default_factory=dict)                    # step -> epoch


@dataclass
class Schedule:
    generations: list[Generation]
    batches: list[list[int]]      # the surviving steps' global batches, in order
    epochs: list[int]             # the epoch of each
    rolled_back: int              # steps run but not committed before a failure


def read(log_dir: Path) -> Schedule:
    """Parse the logs and check what must hold whatever the failures were: each
    generation resumes from the last commit of the one before (nothing committed is
    lost), every rank logged every step, and the surviving steps are 1, 2, ... once."""
    generations: dict[int, Generation] = {}
    for path in sorted(log_dir.glob("g*-r*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            gen = generations.setdefault(record["generation"], Generation(record["generation"]))
            if record["kind"] == "resume":
                gen.size, gen.resume_step, gen.resume_seq = (record["size"], record["step"],
                                                            record["seq"])
            elif record["kind"] == "commit":
                gen.commits.append(record)
            elif record["kind"] == "step":
                gen.steps.setdefault(record["step"], {})[record["rank"]] = record["indices"]
                gen.epochs[record["step"]] = record["epoch"]
    ordered = [generations[g] for g in sorted(generations)]
    assert [g.number for g in ordered] == list(range(1, len(ordered) + 1)), ordered
    batches, epochs, rolled_back = [], [], 0
    for gen, after in zip(ordered, [*ordered[1:], None]):
        for step, ranks in gen.steps.items():
            assert sorted(ranks) == list(range(gen.size)) or after is not None, \
                f"generation {gen.number} step {step}: ranks {sorted(ranks)} of {gen.size}"
        end = max(gen.steps, default=gen.resume_step) if after is None else after.resume_step
        if after is not None:
            last = gen.commits[-1] if gen.commits else None
            assert last is not None and (last["step"], last["seq"]) == \
                (after.resume_step, after.resume_seq), (
                f"generation {after.number} resumed at step {after.resume_step} (commit "
                f"{after.resume_seq}), but generation {gen.number}'s last commit was {last}")
            rolled_back += sum(1 for step in gen.steps if step > end)
        for step in range(gen.resume_step + 1, end + 1):
            ranks = gen.steps.get(step)
            assert ranks is not None and sorted(ranks) == list(range(gen.size)), \
                f"generation {gen.number}: step {step} missing on some rank: {ranks}"
            batches.append([i for r in sorted(ranks) for i in ranks[r]])
            epochs.append(gen.epochs[step])
    return Schedule(ordered, batches, epochs, rolled_back)


def assert_each_sample_once_per_epoch(schedule: Schedule, samples: int) -> None:
    per_epoch: dict[int, Counter] = defaultdict(Counter)
    for batch, epoch in zip(schedule.batches, schedule.epochs):
        per_epoch[epoch].update(batch)
    for epoch, counts in sorted(per_epoch.items()):
        twice = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(set(range(samples)) - set(counts))
        assert not twice and not missing, (f"epoch {epoch}: seen twice {twice[:10]}, never "
                                           f"{missing[:10]}")


def replay(schedule: Schedule):
    """The worker's model after one process trains on the schedule's batches in order."""
    import torch
    import torch.nn.functional as F
    job = import_worker(WORKER)
    x, y = job.data()
    model = job.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for batch in schedule.batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
    return model.state_dict()


def assert_matches_replay(log_dir: Path, schedule: Schedule, tol: float = 1e-6) -> None:
    import torch
    final = torch.load(log_dir / "final.pt")
    for name, want in replay(schedule).items():
        got = final[name]
        assert torch.allclose(got, want, rtol=tol, atol=tol), (
            f"{name}: largest difference {float((got - want).abs().max()):.3g} from the replay")


def assert_batches_went_on_from_the_last_commit(result, log_dir: Path) -> None:
    """For the elastic jobs that log batches (the TensorFlow fit and JAX workers): 3
    ranks, rank 1 SIGKILLed after batch 12 of epoch 0, commits every 10 batches. The job
    went on at 2 ranks from commit 2 (epoch 0, batch 10); batches 11 and 12 ran and were
    rolled back; each batch of the schedule survived exactly once, in order."""
    assert_ranks_ok(result, 2, ["same_model_everywhere"])
    assert "generation 1 ended: rank 1 on localhost was killed by SIGKILL" in result.stdout
    assert "generation 2 on 2 ranks (localhost:2)" in result.stdout, result.stdout
    logs = {g: [json.loads(line) for line in (log_dir / f"g{g}-r0.jsonl").read_text()
                .splitlines()] for g in (1, 2)}
    resume = [r for r in logs[2] if r["kind"] == "resume"]
    last_commit = [r for r in logs[1] if r["kind"] == "commit"][-1]
    assert len(resume) == 1 and resume[0]["size"] == 2
    assert (resume[0]["epoch"], resume[0]["batch"], resume[0]["seq"]) == \
        (last_commit["epoch"], last_commit["batch"], last_commit["seq"]) == (0, 10, 2)
    done = [(r["epoch"], r["batch"]) for r in logs[1] if r["kind"] == "step"]
    assert done[-2:] == [(0, 11), (0, 12)]
    survived = done[:10] + [(r["epoch"], r["batch"]) for r in logs[2] if r["kind"] == "step"]
    steps = max(b for _, b in survived)
    assert survived == [(e, b) for e in range(2) for b in range(1, steps + 1)], survived


def assert_resumed_after_a_kill_at_step_12(log_dir: Path, sizes: tuple[int, int]) -> None:
    """The worker's ``--kill RANK 12`` run (commits every 5 steps), under any launcher
    that starts the job again: two generations of ``sizes``, the second resumed from
    commit 2 (step 10) with steps 11 and 12 rolled back, each sample once an epoch, and
    the final weights the replay's."""
    schedule = read(log_dir)
    first, second = schedule.generations
    assert (first.size, second.size) == sizes, schedule.generations
    assert second.resume_step == 10 and second.resume_seq == 2, second
    assert schedule.rolled_back == 2, schedule
    assert_each_sample_once_per_epoch(schedule, 1797)
    assert_matches_replay(log_dir, schedule)
