"""The names the torch collectives negotiate under, as Horovod's torch binding makes
them: every rank must derive the same name for the same call, whichever path the call
takes."""
from __future__ import annotations

from typing import Sequence

from ...common.api import collectives as core
from ...common.api.process_sets import ProcessSet, global_process_set


class FinalName(str):
    """A name names_for made already: passed on as it is. Autograd names an op once and
    derives its backward's names from it ("<name>.grad"), which must not get a second
    op prefix."""
    __slots__ = ()


def names_for(name: str | Sequence[str] | None, count: int, opname: str,
              process_set: ProcessSet = global_process_set) -> list[str]:
    """One name per tensor, as Horovod's torch binding makes them: the op, then the given
    name ("allreduce.loss"; in a group of n, "grouped_allreduce.loss_1ofn" and on), so
    ops of different kinds may share a name, as in Horovod; unnamed ops (and name="")
    get "<op>.noname.<counter>". A grouped op may take a list of names (beyond Horovod),
    each "<op>.<name>", so that a tensor keeps the same name whether it is reduced alone
    or in a group."""
    if name is None or name == "":  # Horovod's binding reads an empty name as none
        return [core.auto_name(opname, process_set) for _ in range(count)]
    if type(name) is FinalName and count == 1:
        return [name]
    if isinstance(name, str):
        if count == 1:
            return [f"{opname}.{name}"]
        return [f"grouped_{opname}.{name}_{i}of{count}" for i in range(1, count + 1)]
    names = [n if type(n) is FinalName else f"{opname}.{n}" for n in name]
    if len(names) != count:
        raise ValueError(f"{opname}: got {len(names)} names for {count} tensors; pass "
                         "one name per tensor, or a single name for the group.")
    return names
