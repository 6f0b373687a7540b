"""Result blocks (buffers.ResultBlocks): handed-out views are never overwritten, dropped
ones are reused, idle blocks are released. Pure logic, one process."""
from __future__ import annotations

import numpy as np

from horovodish.common.execution import buffers
from horovodish.common.execution.buffers import ResultBlocks
from huge_pages import eligible_kib, thp_mode

F32 = np.dtype(np.float32)


def test_live_views_are_never_reused_and_dropped_blocks_are():
    blocks = ResultBlocks()
    first = blocks.take(F32, 100)[10:20].reshape(2, 5)  # a view: the block is in use
    second = blocks.take(F32, 100)
    assert not np.shares_memory(first, second)
    assert len(blocks) == 2
    pointer = second.__array_interface__["data"][0]
    del second
    again = blocks.take(F32, 50)  # the smallest free block that fits: second's
    assert again.__array_interface__["data"][0] == pointer and len(blocks) == 2
    first[:] = 7
    blocks.take(F32, 100)  # first's block is still referenced: a third block
    assert len(blocks) == 3 and (first == 7).all()


def test_dtype_and_size_must_fit():
    blocks = ResultBlocks()
    small = blocks.take(F32, 10)
    del small
    wide = blocks.take(np.dtype(np.float64), 10)
    big = blocks.take(F32, 1000)
    assert wide.dtype == np.float64 and big.size == 1000 and len(blocks) == 3


def counting_allocations(monkeypatch) -> list:
    allocations = []
    real_empty = np.empty

    def counting_empty(*args, **kwargs):
        allocations.append(args)
        return real_empty(*args, **kwargs)
    monkeypatch.setattr(buffers.np, "empty", counting_empty)
    return allocations


def test_idle_blocks_are_released(monkeypatch):
    allocations = counting_allocations(monkeypatch)
    blocks = ResultBlocks(max_idle=4)
    blocks.take(F32, 1000)  # a first-step block: free, and never fits a later take
    for _ in range(10):
        blocks.take(np.dtype(np.float64), 10)
    assert len(blocks) == 1
    allocations.clear()
    blocks.take(F32, 1000)  # the float32 block was released: a new one is allocated
    assert len(allocations) == 1


def test_growing_sizes_do_not_accumulate_blocks():
    blocks = ResultBlocks(max_idle=8)
    for k in range(200):
        blocks.take(F32, 1000 + k)  # every take needs a bigger block; older ones idle
    # Idle blocks go at each sweep (every max_idle // 2 takes): at most max_idle + 4 + 1.
    assert len(blocks) <= 13


def test_blocks_in_use_every_step_are_kept_with_many_buckets(monkeypatch):
    """100 buckets a step, gradients kept across steps (two blocks a bucket alternate):
    after the first steps no block is allocated again."""
    allocations = counting_allocations(monkeypatch)
    blocks = ResultBlocks(max_idle=4)
    held: dict[int, np.ndarray] = {}
    for step in range(6):
        if step == 3:
            allocations.clear()
        for bucket in range(100):
            view = blocks.take(F32, 10 + bucket)
            held[bucket] = view  # replaces (drops) the previous step's view
    assert allocations == [] and len(blocks) <= 200


def test_zero_elements_take_no_block():
    blocks = ResultBlocks()
    assert blocks.take(F32, 0).size == 0 and len(blocks) == 0


def test_idle_block_released_while_another_is_used():
    blocks = ResultBlocks(max_idle=4)
    held = blocks.take(F32, 10)  # stays referenced: later takes need another block
    for _ in range(10):
        blocks.take(F32, 10)
    assert len(blocks) == 2
    del held
    for _ in range(10):
        blocks.take(F32, 10)  # the smallest free one keeps being chosen...
    assert len(blocks) == 1  # ...and the other, idle for more than 4 takes, is released


def test_a_loop_holding_its_last_result_alternates_two_blocks(monkeypatch):
    """out = allreduce(t) in a loop: the previous result is alive during the next take,
    so two blocks alternate, found without a scan, and nothing is allocated after the
    first two takes."""
    allocations = counting_allocations(monkeypatch)
    blocks = ResultBlocks()
    others = [blocks.take(F32, n) for n in (10, 300, 5000)]  # held elsewhere
    out = blocks.take(F32, 1024)
    pointers = set()
    allocations.clear()
    for _ in range(100):
        out = blocks.take(F32, 1024)
        pointers.add(out.__array_interface__["data"][0])
    assert len(allocations) == 1 and len(pointers) == 2 and len(others) == 3


def test_results_kept_in_flight_are_reused_without_a_scan(monkeypatch):
    """20 async out-of-place calls, then their results dropped, round after round (the
    GPU bench's in-flight loop): after the first round every take finds a free block
    among the size's recent ones in at most three checks, with no scan and no
    allocation."""
    allocations = counting_allocations(monkeypatch)
    blocks = ResultBlocks()
    scans = []
    scan = blocks._smallest_free
    monkeypatch.setattr(blocks, "_smallest_free", lambda *a: scans.append(a) or scan(*a))
    held = [blocks.take(F32, 256) for _ in range(20)]
    first_round = {h.__array_interface__["data"][0] for h in held}
    allocations.clear()
    scans.clear()
    checks, sweeping = [], []  # the checks of takes, not those of the periodic sweep
    free, sweep = blocks._free, blocks._release_idle

    def counted_free(i: int) -> bool:
        if not sweeping:
            checks.append(i)
        return free(i)

    def marked_sweep() -> None:
        sweeping.append(True)
        sweep()
        sweeping.clear()
    monkeypatch.setattr(blocks, "_free", counted_free)
    monkeypatch.setattr(blocks, "_release_idle", marked_sweep)
    for _ in range(5):
        held = []
        for _ in range(20):
            held.append(blocks.take(F32, 256))
        assert {h.__array_interface__["data"][0] for h in held} == first_round
    assert allocations == [] and scans == [] and len(checks) <= 3 * 100


def test_small_blocks_align_to_64_bytes_large_ones_to_a_huge_page():
    """Large host blocks (results, the ring's scratch) start on a 2 MiB boundary, so
    the kernel can back all of them with huge pages (MPI's transfers into 4 KiB pages
    ran at half speed); small ones on 64 bytes, what TensorFlow needs."""
    for count, align in ((3, buffers.ALIGN), (1000, buffers.ALIGN),
                         (buffers.HUGE_PAGE // 4, buffers.HUGE_PAGE), (3 << 20, buffers.HUGE_PAGE)):
        block = buffers.aligned_empty(count, F32)
        assert block.size == count and block.__array_interface__["data"][0] % align == 0, \
            f"a block of {count} floats does not start on {align} bytes"
    block = buffers.aligned_empty(3 << 20, F32)  # 12 MiB: numpy advises huge pages
    block.fill(1.0)
    low = block.__array_interface__["data"][0]
    if thp_mode() != "never":
        eligible = eligible_kib(low, low + block.nbytes)
        assert eligible * 1024 == block.nbytes, \
            f"{eligible} kB of a {block.nbytes >> 20} MiB block may get huge pages"
