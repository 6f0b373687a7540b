"""Timeline: a Chrome-trace JSON file from rank 0, one row per tensor.

Rows show NEGOTIATE_<OP> (with an instant mark as each rank reports ready; on the cache
fast path only rank 0's own mark is known), then the op
with nested phases: QUEUE (ready, waiting behind earlier groups), MEMCPY_IN_FUSION_BUFFER,
the collective named after its backend (e.g. RING_ALLREDUCE), MEMCPY_OUT_FUSION_BUFFER.
The file ends in ']' after every flush, so it parses while training runs (Perfetto,
chrome://tracing). Events are buffered and written at most every flush interval, at the
end of a cycle (idle ranks still cycle every 20 ms): what happened is in the file within
about 70 ms, as a script that reads its own timeline expects (Horovod's test reads it
0.1 s after an allreduce).
"""
from __future__ import annotations

import json
import os
import threading
import time

_FLUSH_INTERVAL = 0.05


def now_us() -> float:
    return time.perf_counter() * 1e6


class Timeline:
    def __init__(self, path: str, mark_cycles: bool = False) -> None:
        self.path = path
        self.mark_cycles = mark_cycles
        self._rows: dict[str, int] = {}
        self._events: list[str] = []
        self._lock = threading.Lock()
        self._closed = False
        self._last_flush = 0.0
        self._negotiating: dict[str, tuple[str, float]] = {}
        self._file = open(path, "w+b")
        self._file.write(b"[\n")
        self._empty = True
        self._emit({"name": "process_name", "ph": "M", "pid": 0,
                    "args": {"name": "horovodish rank 0"}})
        self.flush(force=True)

    # -- events --------------------------------------------------------------------------
    def _emit(self, event: dict) -> None:
        self._events.append(json.dumps(event, separators=(",", ":")))

    def _row(self, name: str) -> int:
        row = self._rows.get(name)
        if row is None:
            row = self._rows[name] = len(self._rows) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": 0, "tid": row,
                        "args": {"name": name}})
        return row

    def negotiate_start(self, name: str, opname: str) -> None:
        if name not in self._negotiating:
            self._negotiating[name] = (f"NEGOTIATE_{opname.upper()}", now_us())

    def rank_ready(self, name: str, rank: int) -> None:
        self._events.append(f'{{"name":"{rank}","ph":"i","s":"t","pid":0,'
                            f'"tid":{self._row(name)},"ts":{now_us():.3f}}}')

    def negotiate_end(self, name: str) -> None:
        started = self._negotiating.pop(name, None)
        if started is not None:
            phase, start = started
            self._events.append(f'{{"name":"{phase}","ph":"X","pid":0,"tid":{self._row(name)},'
                                f'"ts":{start:.3f},"dur":{now_us() - start:.3f}}}')

    def group(self, names: list[str], opname: str, marks: list[tuple[str, float]],
              end: float) -> None:
        """One executed group: the op span and its consecutive phases, on every row.

        marks are (phase, start) pairs; each phase ends where the next starts. Each event
        body is formatted once per group and only the row differs per tensor, which keeps
        the cost per tensor to a string concatenation.
        """
        start = marks[0][1]
        bodies = [f'"name":"{opname}","ph":"X","ts":{start:.3f},"dur":{end - start:.3f}}}']
        for (phase, begin), (_, finish) in zip(marks, marks[1:] + [("", end)]):
            bodies.append(f'"name":"{phase}","ph":"X","ts":{begin:.3f},"dur":{finish - begin:.3f}}}')
        rows = [self._row(name) for name in names]
        self._events.extend(f'{{"pid":0,"tid":{row},{body}' for body in bodies for row in rows)

    def cycle(self) -> None:
        if self.mark_cycles:
            self._emit({"name": "CYCLE_START", "ph": "i", "s": "g", "pid": 0, "tid": 0,
                        "ts": now_us()})

    # -- file ----------------------------------------------------------------------------
    def flush(self, force: bool = False) -> None:
        """Append buffered events and re-close the JSON array: one write per flush."""
        now = time.monotonic()
        if not force and (now - self._last_flush < _FLUSH_INTERVAL or not self._events):
            return
        with self._lock:
            if self._closed or not self._events:
                return
            events, self._events = self._events, []
            body = ",\n".join(events)
            prefix = "" if self._empty else ",\n"
            self._empty = False
            self._file.seek(0, os.SEEK_END)
            end = self._file.tell()
            if end > 2:  # step back over the closing "]\n" written last time
                self._file.seek(end - 2)
            self._file.write(f"{prefix}{body}\n]\n".encode())
            self._file.flush()
            self._last_flush = now

    def close(self) -> None:
        self.flush(force=True)
        with self._lock:
            if not self._closed:
                self._closed = True
                self._file.close()
