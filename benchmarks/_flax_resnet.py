"""ResNet-50 written directly in Flax (linen) and optax: the peer a JAX user would
write instead of a PyTensor graph run through Synkhronos.  Not a benchmark itself:
``resnet50_scaling.py`` and ``resnet50_profile.py`` time it beside Synkhronos.

The model is the one of ``demos/resnet`` (ResNet v1.5: the stride of a
downsampling block on its 3x3 convolution; 7x7 stem, 3x3 max pool, global mean,
dense head), written the way Flax's own ImageNet example writes it: NHWC images,
``nn.Conv`` without bias, ``nn.BatchNorm`` on the batch's statistics (Flax also keeps
running averages, which Synkhronos's demo does not), float32 parameters, and for
``precision="bf16"`` every layer computing in bfloat16 (``dtype=jnp.bfloat16``: its
activations, batch norm included, are bfloat16; Flax computes the statistics in
float32), the loss in float32.  ``"highest"`` and ``"tf32"`` compute in float32
with JAX's default matmul precision set to ``highest`` or ``tensorfloat32``.  One
jitted step (forward, backward, momentum SGD) with its state donated, as optax's
examples do; on ``n`` GPUs the batch is sharded over a one-axis mesh and jit
inserts the gradient all-reduce (batch statistics are then the whole batch's).
"""

import functools

from _common import module_version

__all__ = ["flax_step"]

JAX_PRECISION = {"highest": "highest", "fp32": "highest", "tf32": "tensorfloat32", "bf16": None}


def _model(blocks, classes, dtype):
    import flax.linen as nn
    import jax.numpy as jnp

    conv = functools.partial(nn.Conv, use_bias=False, dtype=dtype)
    norm = functools.partial(nn.BatchNorm, use_running_average=False, momentum=0.9, epsilon=1e-5,
                             dtype=dtype)

    class Bottleneck(nn.Module):
        features: int
        strides: int

        @nn.compact
        def __call__(self, x):
            s = (self.strides, self.strides)
            y = nn.relu(norm()(conv(self.features, (1, 1))(x)))
            y = nn.relu(norm()(conv(self.features, (3, 3), s, padding=((1, 1), (1, 1)))(y)))
            y = norm()(conv(4 * self.features, (1, 1))(y))
            if x.shape[-1] != 4 * self.features or self.strides != 1:
                x = norm()(conv(4 * self.features, (1, 1), s)(x))
            return nn.relu(x + y)

    class ResNet(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(norm()(conv(64, (7, 7), (2, 2), padding=((3, 3), (3, 3)))(x)))
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
            for stage, n_blocks in enumerate(blocks):
                for i in range(n_blocks):
                    x = Bottleneck(64 * 2 ** stage, 2 if (i == 0 and stage > 0) else 1)(x)
            return nn.Dense(classes, dtype=dtype)(jnp.mean(x, axis=(1, 2)))

    return ResNet()


def flax_step(blocks, classes, batch, image_size, precision, n=1, seed=0):
    """A training step of the Flax ResNet on ``n`` GPUs, ``batch`` images per GPU.

    Returns
    -------
    step : callable
        One step on the same random images and labels; returns the loss as a float
        (fetched to the host, as the other sides do).
    dtypes : str
        What computes in which precision, for the benchmark's table.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if JAX_PRECISION[precision]:
        jax.config.update("jax_default_matmul_precision", JAX_PRECISION[precision])
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    model = _model(blocks, classes, dtype)
    mesh = Mesh(np.array(jax.devices()[:n]), ("data",))
    shard, replicate = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    rng = np.random.default_rng(seed)
    x = jax.device_put(rng.standard_normal((batch * n, image_size, image_size, 3)).astype("float32"), shard)
    y = jax.device_put(rng.integers(0, classes, batch * n).astype("int32"), shard)
    variables = model.init(jax.random.key(seed), jnp.zeros((1, image_size, image_size, 3), jnp.float32))
    tx = optax.sgd(0.01, momentum=0.9)
    state = jax.device_put((variables["params"], variables["batch_stats"],
                            tx.init(variables["params"])), replicate)

    @functools.partial(jax.jit, donate_argnums=0)
    def train_step(state, x, y):
        params, stats, opt = state

        def loss_fn(p):
            logits, new = model.apply({"params": p, "batch_stats": stats}, x, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)
            return loss.mean(), new["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), stats, opt), loss

    def step():
        nonlocal state
        state, loss = train_step(state, x, y)
        return float(loss)

    return step, "Flax %s, jax %s" % (module_version("flax"), jax.__version__)
