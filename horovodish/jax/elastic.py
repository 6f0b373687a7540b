"""Elastic training for JAX: ``hvd.elastic.JaxState`` and the retrying ``run``.

    state = hvd.elastic.JaxState(params=params, opt_state=opt_state, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            while state.batch < steps_per_epoch:        # state.batch: batches done
                grads = grad(state.params, *batch_at(state.epoch, state.batch))
                updates, state.opt_state = optimizer.update(grads, state.opt_state,
                                                            state.params)
                state.params = optax.apply_updates(state.params, updates)
                state.batch += 1
                if state.batch % 10 == 0:
                    state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()

    train(state)

JAX arrays are immutable, so the state holds pytrees that the loop replaces (assign
``state.params``, never a local copy of it). When a collective fails, ``run`` restores
the last commit, re-initializes horovodish, syncs the state from rank 0 and calls the
function again; under ``horovodishrun --min-np ...`` a job restarted after a lost rank
resumes from the newest commit on disk (horovodish.common.elastic, docs/elastic.md).
"""
from __future__ import annotations

import copy
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..common.api.objects import broadcast_object, check_same_layout
from ..common.elastic import ObjectState, State, run
from .trees import broadcast_parameters

__all__ = ["JaxState", "State", "run"]


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array)


def _key_impl(leaf: jax.Array) -> str | None:
    """The PRNG implementation of a key array (``jax.random.key``), else None."""
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(leaf))
    return None


def _holds_arrays(value: Any) -> bool:
    return any(_is_array(leaf) for leaf in jax.tree_util.tree_leaves(value))


class _Leaf(NamedTuple):
    """What the ranks compare before a sync: an array's shape and dtype, or for another
    leaf (a Python int) its type."""
    shape: tuple[int, ...]
    dtype: str


def _leaf(leaf: Any) -> _Leaf:
    if _is_array(leaf):
        return _Leaf(tuple(leaf.shape), str(leaf.dtype))
    return _Leaf((), type(leaf).__name__)


def _copy(tree: Any) -> Any:
    """A copy whose arrays are new buffers (a jitted step that donates the live arrays
    leaves the commit intact) and whose other leaves (an optimizer's step count as a
    Python int) are deep copies."""
    return jax.tree_util.tree_map(
        lambda leaf: jnp.copy(leaf) if _is_array(leaf) else copy.deepcopy(leaf), tree)


class JaxState(ObjectState):
    """Pytrees of JAX arrays (``params``, ``opt_state``, and any keyword whose value
    holds a ``jax.Array``, such as a PRNG key) and plain picklable attributes (epoch,
    batch, ...). ``commit()`` copies the pytrees (on their device), ``restore()`` puts
    the copies back, ``sync()`` broadcasts rank 0's arrays with ``broadcast_parameters``
    once the ranks agree that their pytrees line up, and the other leaves and the
    attributes with ``broadcast_object``."""

    def __init__(self, params: Any = None, opt_state: Any = None, **kwargs: Any) -> None:
        trees = {"params": params, "opt_state": opt_state,
                 **{key: value for key, value in kwargs.items() if _holds_arrays(value)}}
        self._trees = [key for key, value in trees.items() if value is not None]
        self._saved_trees: dict[str, Any] = {}
        for key, value in trees.items():
            setattr(self, key, value)
        super().__init__(**{key: value for key, value in kwargs.items()
                            if key not in self._trees})
        self.save()

    def save(self) -> None:
        self._saved_trees = {key: _copy(getattr(self, key)) for key in self._trees}
        super().save()

    def restore(self) -> None:
        for key, saved in self._saved_trees.items():
            setattr(self, key, _copy(saved))  # copies: the commit outlives a donation
        super().restore()

    def _sync_from(self, root: int) -> None:
        """Make every rank's state root's (and that the restore point)."""
        for key in self._trees:
            leaves, treedef = jax.tree_util.tree_flatten(getattr(self, key))
            check_same_layout([_leaf(leaf) for leaf in leaves], root,
                              f"sync of JaxState.{key}", f"elastic.sync.{key}",
                              unit=("leaf", "leaves"), fix="the same model and optimizer state")
            synced = broadcast_parameters([leaf for leaf in leaves if _is_array(leaf)],
                                          root_rank=root)
            others = broadcast_object([leaf for leaf in leaves if not _is_array(leaf)], root,
                                      name=f"elastic.sync.{key}.others")
            synced, others = iter(synced), iter(others)
            leaves = [next(synced) if _is_array(leaf) else next(others) for leaf in leaves]
            setattr(self, key, jax.tree_util.tree_unflatten(treedef, leaves))
        super()._sync_from(root)

    def _payload(self) -> Any:
        """The commit on its way to disk: arrays as numpy (pickle writes their bytes out
        of band; a PRNG key array as its key data), with the index of each leaf that was
        a JAX array and its key implementation (or None)."""
        trees = {}
        for key, saved in self._saved_trees.items():
            leaves, treedef = jax.tree_util.tree_flatten(saved)
            arrays = {i: _key_impl(leaf) for i, leaf in enumerate(leaves) if _is_array(leaf)}
            for i, impl in arrays.items():
                leaves[i] = np.asarray(jax.random.key_data(leaves[i]) if impl else leaves[i])
            trees[key] = (jax.tree_util.tree_unflatten(treedef, leaves), arrays)
        return {**super()._payload(), "trees": trees}

    def _load_payload(self, payload: Any) -> None:
        super()._load_payload(payload)
        trees = payload["trees"]
        if sorted(trees) != sorted(self._trees):
            raise ValueError(f"the commit on disk holds the pytrees {sorted(trees)}, this "
                             f"JaxState has {sorted(self._trees)}")
        self._saved_trees = {}
        for key, (tree, arrays) in trees.items():
            leaves, treedef = jax.tree_util.tree_flatten(tree)
            for i, impl in arrays.items():
                leaves[i] = jnp.asarray(leaves[i])
                if impl is not None:
                    leaves[i] = jax.random.wrap_key_data(leaves[i], impl=impl)
            self._saved_trees[key] = jax.tree_util.tree_unflatten(treedef, leaves)
