"""Commits on disk, so that a job restarted by the elastic launcher goes on from its last
commit even when the host of rank 0 (or any one host) is gone.

Why on disk and on every host: MPI cannot shrink a running job, so when a rank or a host
is lost the launcher starts a new job, and the state of the old processes is gone with
them. Horovod keeps the commit in the memory of the surviving workers; here no process
survives, so each commit is written by the first local rank of every host to a per-job
directory on that host (``HOROVODISH_ELASTIC_DIR``, set by ``horovodishrun``; one
sub-directory per host name, so hosts that share a file system do not write over each
other; under torchrun, a directory of the user's named by torchrun's run id). A new
job's ranks agree on the newest commit that some rank can read and broadcast it from
there (``State.sync``, in horovodish.common.elastic). Commits are pickles: every folder
on the way is this user's alone (mode 0700), and one that another user owns or others
can write to is refused.

Layout: ``<dir>/<hostname>/commit-<seq>.bin``, written to ``.tmp-...`` and renamed, so a
reader sees a whole commit or none; once the new one is in place the older one becomes
the spare (``.spare``), which the next commit overwrites in place, so a host holds one
state and one retired copy of it.
The file is a pickle (protocol 5) with its large buffers (numpy arrays) written after it
out of band: no copy of a 100 MB model into one bytes object, and a read maps the arrays
onto the file's bytes. The launcher removes the directory when the job ends.
"""
from __future__ import annotations

import os
import pickle
import re
import socket
import stat
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ENV_DIR = "HOROVODISH_ELASTIC_DIR"
_MAGIC = b"HVDCOMMIT1\n"
_NAME = re.compile(r"^commit-(\d{12})\.bin$")
_KEEP = 1
_SPARE = ".spare"  # a retired commit's file, overwritten by the next write
_ALIGN = 64  # each array starts on a cache line of the file (and of the buffer read)


def directory() -> Path | None:
    """This host's commit directory, or None when the job was not started elastic:
    under ``HOROVODISH_ELASTIC_DIR`` (horovodishrun's elastic jobs), or, under torchrun,
    under a directory of this user's named by torchrun's run id, so that the group
    torchrun starts again after a failure finds the commits of the one before."""
    root = os.environ.get(ENV_DIR)
    if root:
        return Path(root) / socket.gethostname()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        return torchrun_root() / _safe_name(run_id) / socket.gethostname()
    return None


def torchrun_root() -> Path:
    """Where this user's jobs under torchrun keep their commits."""
    return Path(tempfile.gettempdir()) / f"horovodish-elastic-{os.geteuid()}"


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:128] or "_"


def is_job_owned(folder: Path) -> bool:
    """Whether nobody else removes folder at the job's end (horovodishrun removes the
    directories it made; under torchrun the job does, once ``run`` has returned)."""
    return not os.environ.get(ENV_DIR) and torchrun_root() in folder.parents


def secure(folder: Path, create: bool = True) -> bool:
    """Make sure folder and the folders above it up to the commit root are this user's
    alone: created with mode 0700 where missing (when ``create``), and refused with the
    reason when another user owns one or others can write to it (a commit is a pickle:
    whoever can write one runs code in every rank that loads it). Returns whether
    folder exists."""
    root = Path(os.environ[ENV_DIR]) if os.environ.get(ENV_DIR) else torchrun_root()
    chain = [folder, *[p for p in folder.parents if p == root or root in p.parents]]
    for path in reversed(chain):
        if not path.exists():
            if not create:
                return False
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
        if info.st_uid != os.geteuid():
            raise PermissionError(
                f"elastic commits: {path} belongs to user id {info.st_uid}, not to this "
                f"user ({os.geteuid()}); commits are pickles, so horovodish reads none "
                f"from a directory another user controls. Remove it, or set {ENV_DIR} "
                "to a directory of your own.")
        if info.st_mode & 0o022:
            raise PermissionError(
                f"elastic commits: others can write to {path} (mode "
                f"{stat.filemode(info.st_mode)}); commits are pickles, so horovodish reads "
                f"none from such a directory. chmod go-w {path}, or set {ENV_DIR} to a "
                "directory of your own.")
    return True


def _path(folder: Path, seq: int) -> Path:
    return folder / f"commit-{seq:012d}.bin"


def newest(folder: Path | None) -> int:
    """The sequence number of the newest commit in folder (0: none)."""
    if folder is None or not secure(folder, create=False) or not folder.is_dir():
        return 0
    found = [int(m.group(1)) for m in map(_NAME.match, os.listdir(folder)) if m]
    return max(found, default=0)


def write(folder: Path, seq: int, payload: Any) -> int:
    """Write commit seq atomically (temporary file, then rename) and retire the older
    ones. Returns the bytes written.

    The file written is the last retired commit's (the spare), overwritten in place:
    its pages are in the page cache already, while a new file's must be allocated and
    the deleted one's freed (11.8 MB took 1.6 ms overwritten against 11.8 ms as a new
    file here; docs/tuning.md). Under its temporary name no reader takes it for a
    commit."""
    secure(folder)
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    tmp = folder / f".tmp-{os.getpid()}-{seq}"
    try:
        os.replace(folder / _SPARE, tmp)
        mode = "r+b"
    except FileNotFoundError:
        mode = "wb"
    with open(tmp, mode) as out:
        out.write(_MAGIC)
        out.write(struct.pack("<QQ", len(head), len(views)))
        out.write(struct.pack(f"<{len(views)}Q", *(view.nbytes for view in views)))
        out.write(head)
        for view in views:
            out.write(bytes(-out.tell() % _ALIGN))
            out.write(view)
        size = out.tell()
        out.truncate()  # a spare from a larger state is longer
    os.replace(tmp, _path(folder, seq))
    retired = sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(folder))
                     if m and int(m.group(1)) <= seq - _KEEP)
    for old in retired:
        try:
            if old == retired[-1]:
                os.replace(_path(folder, old), folder / _SPARE)  # the next write's file
            else:
                os.unlink(_path(folder, old))
        except FileNotFoundError:
            pass
    return size


def read(folder: Path, seq: int) -> Any:
    """The payload of commit seq (arrays in it share one buffer read from the file)."""
    secure(folder, create=False)
    path = _path(folder, seq)
    size = path.stat().st_size
    raw = np.empty(size + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    data = memoryview(raw[start:start + size])
    with open(path, "rb") as source:
        if source.readinto(data) != size:
            raise ValueError(f"{path} changed while it was read")
    if bytes(data[:len(_MAGIC)]) != _MAGIC:
        raise ValueError(f"{path} is not a horovodish commit")
    at = len(_MAGIC)
    head_size, count = struct.unpack_from("<QQ", data, at)
    at += 16
    sizes = struct.unpack_from(f"<{count}Q", data, at)
    at += 8 * count
    head = data[at:at + head_size]
    at += head_size
    buffers = []
    for size in sizes:
        at += -at % _ALIGN
        buffers.append(data[at:at + size])
        at += size
    return pickle.loads(head, buffers=buffers)
