"""SyncBatchNormalization, the Partial (local-layer) tape and optimizer, and the
``horovodish.keras`` module, on every rank against references computed in-process
without collectives: one process on the whole batch, or this rank's own gradients.
Each is a named check (tests/worker_support.py), in CHECKS; collectives_worker.py runs
them last in its jobs of two ranks or more (TensorFlow's import costs seconds per rank).
"""
from __future__ import annotations

import numpy as np
from checks import F64_TOL
from worker_support import (check, close, expect_error,  # noqa: E402
                            same_on_every_rank)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodish.keras as hvd  # noqa: E402  (the module horovod.keras users import)
import horovodish.tensorflow as hvd_tf  # noqa: E402
import horovodish.tensorflow.keras as hvd_tf_keras  # noqa: E402
from keras_worker import LOSS, PER_RANK_BATCH, flat, shard  # noqa: E402

FEATURES, CLASSES = 5, 3


def dataset(size: int, batches: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    x = gen.normal(1.5, 2.0, size=(batches * PER_RANK_BATCH * size, FEATURES)).astype(np.float32)
    y = (np.abs(x[:, :CLASSES]).argmax(1)).astype(np.int32)
    return x, y


def make_model(norm: type) -> keras.Model:
    keras.utils.set_random_seed(99)  # the same weights on every rank and the reference
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(8)(inputs)
    hidden = keras.layers.Activation("relu")(norm(momentum=0.5)(hidden))
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


def dense_grads(grads) -> list[np.ndarray]:
    return [tf.convert_to_tensor(g).numpy() for g in grads]


# -- SyncBatchNormalization ------------------------------------------------------------------
def sync_batch_norm(rank: int, size: int) -> None:
    x, y = dataset(size, 1)
    rows = shard(np.arange(len(x)), rank, size)
    reference = make_model(keras.layers.BatchNormalization)
    with tf.GradientTape() as tape:
        ref_out = reference(x, training=True)
        ref_loss = LOSS(y, ref_out)
    ref_grads = dense_grads(tape.gradient(ref_loss, reference.trainable_variables))
    ref_bn = reference.layers[2]

    def step(model, xs, ys):
        with tf.GradientTape() as tape:
            out = model(xs, training=True)
            loss = LOSS(ys, out)
        tape = hvd_tf.DistributedGradientTape(tape)
        return out, tape.gradient(loss, model.trainable_variables)

    for mode, run in (("eager", step), ("tf.function", tf.function(step))):
        model = make_model(hvd.SyncBatchNormalization)
        bn = model.layers[2]
        check(isinstance(bn, hvd_tf.SyncBatchNormalization), "the layer is ours")
        out, grads = run(model, tf.constant(x[rows]), tf.constant(y[rows]))
        close(out.numpy(), ref_out.numpy()[rows], f"{mode}: outputs use the global batch's "
              "statistics", tol=1e-5)
        for got, want, var in zip(dense_grads(grads), ref_grads, model.trainable_variables):
            close(got, want, f"{mode}: gradient of {var.path} == whole batch's", tol=1e-5)
        close(bn.moving_mean.numpy(), ref_bn.moving_mean.numpy(),
              f"{mode}: moving mean", tol=1e-5)
        close(bn.moving_variance.numpy(), ref_bn.moving_variance.numpy(),
              f"{mode}: moving variance", tol=1e-5)
        local = make_model(keras.layers.BatchNormalization)(x[rows], training=True).numpy()
        check(not np.allclose(local, out.numpy(), atol=1e-3),
              f"{mode}: differs from per-rank statistics (the test can see a local layer)")

    # A large mean against a small spread: E[x^2] - E[x]^2 in float32 gave 0.25 for 0.01.
    wide = (1000.0 + 0.1 * np.random.default_rng(8).normal(size=(4 * size, 3))).astype(
        np.float32)
    want = keras.layers.BatchNormalization()(wide, training=True).numpy()
    got = hvd.SyncBatchNormalization()(wide[4 * rank:4 * rank + 4], training=True).numpy()
    close(got, want[4 * rank:4 * rank + 4], "large mean, small spread", tol=1e-3)
    check(isinstance(hvd.SyncBatchNormalization(fused=False), hvd.SyncBatchNormalization),
          "fused=False accepted (Horovod's layer takes it)")
    expect_error(lambda: hvd.SyncBatchNormalization(fused=True), ValueError, "fused=False",
                 what="fused=True refused")

    # A mask: only the unmasked positions of every rank count.
    seq = np.random.default_rng(5).normal(size=(2 * size, 3, FEATURES)).astype(np.float32)
    mask = np.random.default_rng(6).integers(0, 2, size=(2 * size, 3)).astype(bool)
    mask[:, 0] = True
    mine = slice(2 * rank, 2 * rank + 2)
    ref_layer = keras.layers.BatchNormalization()
    want = ref_layer(seq, training=True, mask=mask).numpy()
    layer = hvd.SyncBatchNormalization()
    got = layer(seq[mine], training=True, mask=mask[mine]).numpy()
    close(got, want[mine], "masked: the global batch's masked statistics", tol=1e-5)

    # model.fit on shards == one process on the whole batch, moving statistics included.
    x, y = dataset(size, 4)
    reference = make_model(keras.layers.BatchNormalization)
    reference.compile(keras.optimizers.SGD(0.1), LOSS)
    reference.fit(x, y, batch_size=PER_RANK_BATCH * size, epochs=2, shuffle=False, verbose=0)
    model = make_model(hvd.SyncBatchNormalization)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), LOSS)
    model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=2,
              shuffle=False, verbose=0)
    check(not model.jit_compile, "SyncBatchNormalization keeps jit_compile='auto' off")
    same_on_every_rank(flat(model.get_weights()), "fit: weights")
    close(flat(model.get_weights()), flat(reference.get_weights()),
          "fit with SyncBatchNormalization == one process on the whole batch", tol=1e-4)

    expect_error(lambda: hvd.SyncBatchNormalization(synchronized=True), ValueError,
                 "synchronized=True", what="tf.distribute's synchronized flag is refused")


# -- local layers --------------------------------------------------------------------------
def local_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(6, activation="tanh", name="shared")(inputs)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(hidden))


def partial_tape(rank: int, size: int) -> None:
    x, y = dataset(size, 1, seed=11)
    mine = shard(np.arange(len(x)), rank, size)
    model = local_model()
    head = model.get_layer("head")
    variables = model.trainable_variables
    local_ids = {id(v) for v in head.trainable_weights}
    with tf.GradientTape() as tape:
        whole = LOSS(y, model(x))
    global_grads = dense_grads(tape.gradient(whole, variables))
    with tf.GradientTape() as tape:
        own = LOSS(y[mine], model(x[mine]))
    own_grads = dense_grads(tape.gradient(own, variables))

    def grads_of(scale: bool, compiled: bool):
        def compute(xs, ys):
            with tf.GradientTape() as tape:
                loss = LOSS(ys, model(xs))
            tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=head,
                                                         scale_local_gradients=scale)
            return tape.gradient(loss, variables)
        run = tf.function(compute) if compiled else compute
        return dense_grads(run(tf.constant(x[mine]), tf.constant(y[mine])))

    for scale, compiled in ((True, False), (False, False), (True, True)):
        what = f"scale_local_gradients={scale}{' in tf.function' if compiled else ''}"
        for got, var, glob, own_g in zip(grads_of(scale, compiled), variables, global_grads,
                                         own_grads):
            if id(var) in local_ids:  # this rank's own gradient, not reduced
                close(got, own_g / (size if scale else 1), f"{what}: local {var.path}",
                      tol=1e-6)
            else:
                close(got, glob, f"{what}: reduced {var.path}", tol=1e-6)
    # Horovod's split of the same gradients: local (source, gradient) pairs, then reduced.
    with tf.GradientTape() as tape:
        loss = LOSS(y[mine], model(x[mine]))
    tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=head)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, variables)
    check([id(v) for v, _ in local_pairs] == [id(v) for v in variables if id(v) in local_ids]
          and [id(v) for v, _ in global_pairs]
          == [id(v) for v in variables if id(v) not in local_ids],
          "get_local_and_global_gradients: the local sources, then the others, in order")
    by_var = dict(zip(map(id, variables), zip(global_grads, own_grads)))
    for var, grad in local_pairs + global_pairs:
        glob, own_g = by_var[id(var)]
        want = own_g / size if id(var) in local_ids else glob
        close(dense_grads([grad])[0], want, f"get_local_and_global_gradients: {var.path}",
              tol=1e-6)
    expect_error(lambda: hvd_tf.PartialDistributedGradientTape(tf.GradientTape(),
                                                               local_layers=[head, "x"]),
                 ValueError, "must be Keras layers", what="local_layers of the wrong type")


def partial_optimizer(rank: int, size: int) -> None:
    model = local_model()
    head = model.get_layer("head")
    variables = model.trainable_variables
    before = [v.numpy().copy() for v in variables]
    local_ids = {id(v) for v in head.trainable_weights}
    grads = [np.full(v.shape, rank + 1.0, np.float32) * (i + 1) for i, v in enumerate(variables)]
    optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[head])
    optimizer.apply_gradients(zip([tf.constant(g) for g in grads], variables))
    mean_of_ranks = np.mean([r + 1.0 for r in range(size)])
    for i, (var, start, grad) in enumerate(zip(variables, before, grads)):
        if id(var) in local_ids:
            close(var.numpy(), start - grad / size, f"optimizer: local {var.path}", tol=1e-6)
        else:
            close(var.numpy(), start - mean_of_ranks * (i + 1), f"optimizer: {var.path}",
                  tol=1e-6)
    check(not hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))._hvd_local,
          "another optimizer's local set is its own")

    # BroadcastGlobalVariablesCallback(local_variables=) leaves those as each rank has them.
    model = local_model()
    start = [w.copy() for w in model.get_weights()]  # the same on every rank (seeded)
    model.set_weights([w + rank for w in start])
    head = model.get_layer("head")
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(
        0, local_variables=head.trainable_weights)
    callback.set_model(model)
    callback.on_train_begin()
    close(flat(model.get_layer("shared").get_weights()),
          flat(start[:2]), "broadcast: the shared layer is rank 0's", tol=0)
    close(flat(head.get_weights()), flat(start[2:]) + rank,
          "broadcast: the local head is this rank's own", tol=1e-6)

    # model.fit: the shared layer stays identical across ranks, the head does not.
    x, y = dataset(size, 3, seed=13)
    model = local_model()
    model.compile(hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.2),
                                                  local_layers=model.get_layer("head")), LOSS)
    model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=2,
              shuffle=False, verbose=0)
    same_on_every_rank(flat(model.get_layer("shared").get_weights()), "fit: shared layer")
    heads = hvd.allgather_object(flat(model.get_layer("head").get_weights()))
    check(not np.allclose(heads[0], heads[1]), "fit: the local head differs between ranks")


def local_overflow_under_mixed_precision(rank: int, size: int) -> None:
    """A local layer's fp16 gradient overflows on the last rank only: every rank's loss
    scaler must skip that step (once only that rank did, and the shared weights and the
    loss scales parted ways), and the next step applies everywhere."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(5)
        inputs = keras.Input((FEATURES,))
        # A tiny kernel: outputs stay small while its gradient (inputs x upstream x the
        # loss scale) overflows float16 for large inputs.
        hidden = keras.layers.Dense(4, name="local",
                                    kernel_initializer=keras.initializers.Constant(1e-6))(inputs)
        model = keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(hidden))
        optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                                    local_layers=model.get_layer("local"))
        model.compile(optimizer, LOSS)
        x, y = dataset(size, 1, seed=17)
        xs, ys = shard(x, rank, size), shard(y, rank, size)
        head, local = model.get_layer("head"), model.get_layer("local")
        start_head, start_local = flat(head.get_weights()), flat(local.get_weights())
        start_scale = float(optimizer.initial_scale)
        # x 3000: the inputs stay below float16's 65504, the local kernel's gradient not.
        big = xs * (3e3 if rank == size - 1 else 1.0)
        model.fit(big, ys, batch_size=len(xs), epochs=1, shuffle=False, verbose=0)
        close(flat(head.get_weights()), start_head, "overflow on one rank: the shared "
              "layer is not updated on any rank", tol=0)
        close(flat(local.get_weights()), start_local, "overflow on one rank: no local "
              "layer is updated", tol=0)
        close(float(optimizer.dynamic_scale.numpy()), start_scale / 2,
              "overflow on one rank: every rank halves its loss scale", tol=0)
        model.fit(xs, ys, batch_size=len(xs), epochs=1, shuffle=False, verbose=0)
        check(not np.allclose(flat(head.get_weights()), start_head),
              "the next step (no overflow) updates the shared layer")
        same_on_every_rank(flat(head.get_weights()), "mixed precision: shared layer")
    finally:
        keras.config.set_dtype_policy("float32")


def aggregation_after_failure(rank: int, size: int) -> None:
    """backward_passes_per_step: a reduction that fails drops that round and the next
    rounds train (the counter once stuck past its mark, and training stopped silently)."""
    from horovodish.common.errors import HorovodInternalError
    variable = keras.Variable(np.zeros(2, np.float32))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    grad = tf.constant([1.0, 2.0]) * (rank + 1)
    optimizer.apply_gradients([(grad, variable)])
    working = optimizer._hvd_reduction

    class Failing:
        def __getattr__(self, key):
            return getattr(working, key)

        def __call__(self, *args, **kwargs):
            raise HorovodInternalError("a peer was lost (simulated)")
    optimizer._hvd_reduction = Failing()
    expect_error(lambda: optimizer.apply_gradients([(grad, variable)]), HorovodInternalError,
                 "simulated", what="the reduction fails")
    optimizer._hvd_reduction = working
    for _ in range(6):
        optimizer.apply_gradients([(grad, variable)])
    mean = np.mean([r + 1.0 for r in range(size)]) * np.array([1.0, 2.0])
    close(variable.numpy(), -3 * 2 * mean, "three rounds of two passes after the failure",
          tol=1e-6)


# -- horovodish.keras ------------------------------------------------------------------------
def keras_module(rank: int, size: int) -> None:
    import horovodish.keras.callbacks as callbacks
    import horovodish.keras.elastic as elastic
    from horovodish.keras.callbacks import MetricAverageCallback
    check(callbacks is hvd_tf_keras.callbacks and hvd.callbacks is callbacks,
          "horovodish.keras.callbacks is the Keras adapter's")
    check(elastic is hvd_tf_keras.elastic and hasattr(elastic, "CommitStateCallback"),
          "horovodish.keras.elastic is the Keras adapter's")
    check(MetricAverageCallback is hvd_tf_keras.callbacks.MetricAverageCallback,
          "from horovodish.keras.callbacks import ...")
    for name in hvd_tf_keras.__all__:
        check(getattr(hvd, name) is getattr(hvd_tf_keras, name), f"horovodish.keras.{name}")
    got = hvd.allreduce(np.array([rank, 2.0]), name="keras_module.value")
    close(got.numpy(), [np.mean(range(size)), 2.0], "horovodish.keras.allreduce", tol=F64_TOL)


# -- Horovod's smaller names -----------------------------------------------------------------
def horovod_names(rank: int, size: int) -> None:
    local_sizes = hvd.allgather_object(hvd.local_size())
    for module in (hvd, hvd_tf):
        check(module.is_homogeneous() == (len(set(local_sizes)) == 1), "is_homogeneous")
        check(module.sycl_built() is False and module.gloo_enabled() is False,
              "sycl_built/gloo_enabled")

    def layout():
        return [hvd_tf.size_op(), hvd_tf.rank_op(), hvd_tf.local_size_op(),
                hvd_tf.local_rank_op(), hvd_tf.process_set_included_op(0)]
    want = [size, rank, hvd.local_size(), hvd.local_rank(), 1]
    for what, values in (("eager", layout()), ("tf.function", tf.function(layout)())):
        check([int(v.numpy()) for v in values] == want, f"{what}: the layout ops")
        check(all(v.dtype == tf.int32 for v in values), f"{what}: int32 like Horovod's")
    expect_error(lambda: hvd_tf.size_op(process_set_id=77), ValueError, "77", what="unknown set id")

    from_one = hvd_tf.broadcast_object_fn(root_rank=1)({"rank": rank})
    check(from_one == {"rank": 1}, f"broadcast_object_fn(root_rank=1): {from_one}")

    x = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2) * (rank + 1))
    mean = np.arange(6, dtype=np.float32).reshape(3, 2) * np.mean(np.arange(1, size + 1))
    close(hvd_tf.allreduce(x, ignore_name_scope=True).numpy(), mean, "ignore_name_scope",
          tol=F64_TOL)
    close(hvd_tf.grouped_allreduce([x], ignore_name_scope=True)[0].numpy(), mean,
          "grouped_allreduce(ignore_name_scope=)", tol=F64_TOL)
    gathered = hvd_tf.grouped_allgather([x], ignore_name_scope=True)[0].numpy()
    close(gathered, np.concatenate([np.arange(6, dtype=np.float32).reshape(3, 2) * (r + 1)
                                    for r in range(size)]), "grouped_allgather(...)",
          tol=F64_TOL)

    # use_generic_names (Horovod's keyword) is accepted; names are positional anyway.
    model = local_model()
    xs, ys = dataset(size, 1, seed=17)
    with tf.GradientTape() as tape:
        whole = LOSS(ys, model(xs))
    want_grads = dense_grads(tape.gradient(whole, model.trainable_variables))
    mine = shard(np.arange(len(xs)), rank, size)
    with tf.GradientTape() as tape:
        loss = LOSS(ys[mine], model(xs[mine]))
    grads = hvd_tf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables,
                                                          use_generic_names=True)
    for got, want in zip(dense_grads(grads), want_grads):
        close(got, want, "gradient(use_generic_names=True)", tol=1e-6)

    # A failure inside tf.function lists a few of its tensors, not all of them.
    @tf.function
    def many(tensors):
        return hvd_tf.grouped_allreduce(tensors, op=hvd.Sum)
    shapes = [(2,)] * 11 + [(2 + rank,)]
    error = expect_error(lambda: many([tf.ones(shape) for shape in shapes]), tf.errors.OpError,
                         "HorovodInternalError", what="a mismatch inside tf.function")
    check("tensors_7:0, ... (4 more)" in str(error) and "tensors_8:0" not in str(error),
          f"the error lists 8 tensors and a count: {error}")
    close(hvd_tf.allreduce(x, op=hvd.Sum, name="after.mismatch").numpy(),
          mean * size, "the next collective works", tol=F64_TOL)


CHECKS = [keras_module, horovod_names, partial_tape, partial_optimizer,
          aggregation_after_failure, local_overflow_under_mixed_precision, sync_batch_norm]
