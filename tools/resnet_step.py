"""A ResNet-50 training step on jaxgemm against the same step on XLA, in one process.

ResNet-50 v1.5 (NHWC; bottleneck blocks with the stride on the 3x3; bfloat16 compute,
float32 parameters), BatchNorm in training mode, softmax cross-entropy on 1000 classes,
SGD with momentum. Every convolution and the classifier are `jaxgemm.flax.Conv` /
`jaxgemm.flax.Linear` in one model and Flax's `nnx.Conv` / `nnx.Linear` in the other,
built from the same seed (the same parameters); BatchNorm, the pooling and the optimizer
are XLA's in both. A synthetic batch stays on the device, so the step times the device's
work, not the host's input pipeline.

    python3 -P tools/resnet_step.py [--batch 256] [--image 224] [--steps 30] [--kernels]
    python3 -P tools/resnet_step.py --check    # a small model: both backends' gradients agree (any machine)

Prints each backend's median wall-clock step (windows of --window steps) and the ratio;
`--kernels` adds each step's CUPTI kernel times per name (tools/example_kernels.py's table).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxgemm.flax as jf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from example_kernels import kernel_medians, show  # noqa: E402

STAGES = (3, 4, 6, 3)  # bottleneck blocks per stage: ResNet-50
CLASSES = 1000


def layers(backend, dtype):
    """(conv, linear, batch_norm) constructors of one backend (float32: exact, no tf32)."""
    conv_cls, linear_cls = (jf.Conv, jf.Linear) if backend == "jaxgemm" else (nnx.Conv, nnx.Linear)
    precision = jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None
    conv = functools.partial(conv_cls, padding="SAME", use_bias=False, dtype=dtype, precision=precision)
    linear = functools.partial(linear_cls, dtype=dtype, precision=precision)
    norm = functools.partial(nnx.BatchNorm, momentum=0.9, epsilon=1e-5, dtype=dtype)
    return conv, linear, norm


class Bottleneck(nnx.Module):
    """relu(bn(1x1) -> relu(bn(3x3, stride)) -> bn(1x1, 4x width) + shortcut)."""

    def __init__(self, c_in, width, stride, make, rngs):
        conv, _, norm = make
        self.conv1, self.bn1 = conv(c_in, width, (1, 1), rngs=rngs), norm(width, rngs=rngs)
        self.conv2, self.bn2 = conv(width, width, (3, 3), strides=stride, rngs=rngs), norm(width, rngs=rngs)
        self.conv3 = conv(width, 4 * width, (1, 1), rngs=rngs)
        self.bn3 = norm(4 * width, scale_init=nnx.initializers.zeros_init(), rngs=rngs)  # each block starts as identity
        project = stride != 1 or c_in != 4 * width  # the shortcut changes shape: a strided 1x1 conv
        self.proj = conv(c_in, 4 * width, (1, 1), strides=stride, rngs=rngs) if project else None
        self.bn_proj = norm(4 * width, rngs=rngs) if project else None

    def __call__(self, x):
        y = jax.nn.relu(self.bn1(self.conv1(x)))
        y = jax.nn.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.proj is None else self.bn_proj(self.proj(x))
        return jax.nn.relu(y + shortcut)


class ResNet(nnx.Module):
    def __init__(self, backend, *, width=64, stages=STAGES, dtype=jnp.bfloat16, rngs):
        make = layers(backend, dtype)
        conv, linear, norm = make
        self.stem, self.bn = conv(3, width, (7, 7), strides=2, rngs=rngs), norm(width, rngs=rngs)
        blocks, c_in = [], width
        for i, count in enumerate(stages):
            for j in range(count):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(Bottleneck(c_in, width * 2**i, stride, make, rngs))
                c_in = 4 * width * 2**i
        self.blocks = nnx.List(blocks)
        self.head = linear(c_in, CLASSES, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.relu(self.bn(self.stem(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2))).astype(jnp.float32)


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def train_step(graphdef):
    """(state, x, y) -> (loss, new state): one gradient and one SGD update, pure (the
    model's and optimizer's state in, their next state out)."""

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    return step


def model_of(backend, args):
    """The command line's model on `backend`, from seed 0 (both backends: the same parameters)."""
    return ResNet(backend, width=args.width, stages=args.stages, dtype=args.dtype, rngs=nnx.Rngs(0))


def gradients(backend, args, x, y):
    model = model_of(backend, args)
    return [np.asarray(g, np.float64) for g in jax.tree.leaves(nnx.jit(nnx.grad(loss_fn))(model, x, y))]


def time_steps(step, state, x, y, steps, window):
    """Median seconds per step over windows of `window` steps (after two warm-up steps)."""
    for _ in range(2):
        loss, state = step(state, x, y)
    loss.block_until_ready()
    per_step = []
    for _ in range(max(1, steps // window)):
        t0 = time.perf_counter()
        for _ in range(window):
            loss, state = step(state, x, y)
        loss.block_until_ready()
        per_step.append((time.perf_counter() - t0) / window)
    return statistics.median(per_step), float(loss), state


def run(backend, args, x, y):
    model = model_of(backend, args)
    optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    step = train_step(graphdef)
    seconds, loss, state = time_steps(jax.jit(step, donate_argnums=0), state, x, y, args.steps, args.window)
    if not np.isfinite(loss):
        raise FloatingPointError(f"{backend}: the loss is {loss}")
    print(f"{backend:>8}: {seconds * 1e3:8.2f} ms a step ({args.batch / seconds:,.0f} images/s), loss {loss:.3f}")
    if args.kernels:
        # (not donated: the profiler calls it again on the same state)
        show(backend, kernel_medians(jax.jit(step), (state, x, y), args.iterations), args.top)
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image", type=int, default=224, help="input height = width")
    parser.add_argument("--width", type=int, default=64, help="the first stage's width (64: ResNet-50)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per backend")
    parser.add_argument("--window", type=int, default=10, help="steps between host synchronizations")
    parser.add_argument("--kernels", action="store_true", help="also the step's CUPTI kernel times (GPU)")
    parser.add_argument("--iterations", type=int, default=10, help="--kernels: profiled steps")
    parser.add_argument("--top", type=int, default=25, help="--kernels: rows per backend")
    parser.add_argument("--check", action="store_true",
                        help="a small float32 model (width 8, one block a stage) on 4 images of 32^2: the two "
                             "backends' gradients agree, and each trains a step")  # fmt: skip
    args = parser.parse_args(argv)
    args.stages, args.dtype = STAGES, jnp.bfloat16
    if args.check:  # float32: bfloat16's BatchNorm gradients differ by tens of percent between XLA's own runs
        args.batch, args.image, args.width, args.stages, args.steps, args.window = 4, 32, 8, (1, 1, 1, 1), 1, 1
        args.dtype = jnp.float32
    if args.kernels and jax.default_backend() != "gpu":
        sys.exit(f"resnet_step: --kernels needs a GPU (JAX's backend here: {jax.default_backend()})")
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (args.batch, args.image, args.image, 3), args.dtype)
    y = jax.random.randint(ky, (args.batch,), 0, CLASSES)
    if args.check:  # same parameters and batch: the same gradients, to float32's rounding
        pairs = zip(gradients("jaxgemm", args, x, y), gradients("xla", args, x, y))
        worst = max(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30) for a, b in pairs)
        print(f"largest relative gradient difference jaxgemm / xla: {worst:.1e}")
        if not (np.isfinite(worst) and worst <= 1e-3):
            return 1
    print(f"ResNet (width {args.width}, stages {args.stages}), batch {args.batch} of {args.image}^2, "
          f"{jnp.dtype(args.dtype).name}, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}")  # fmt: skip
    ours, xla = run("jaxgemm", args, x, y), run("xla", args, x, y)
    print(f"step time XLA / jaxgemm: {xla / ours:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
