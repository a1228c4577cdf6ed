"""Where an example's training step spends its GPU time: per-kernel CUPTI times of the
gradient (forward + backward) of examples/train_cnn.py's or train_lm.py's model, jaxgemm's
backend and XLA's on the same parameters and batch, kernels named and summed per name
(median over iterations). The optimizer's update is the same on both sides and left out.
    python3 -P tools/example_kernels.py [--example cnn|lm] [--size gpu|cpu] [--iterations 20] [--top 20]
`--check` runs each gradient once without timing (any machine; what the tests run).
"""

import argparse
import collections
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def example_inputs(name, size):
    """(module, config, model factory taking a backend, a batch (x, y) of random data)."""
    rng = np.random.default_rng(0)
    if name == "cnn":
        import train_cnn as ex

        cfg = ex.SIZES[size]
        x = rng.integers(0, 256, (cfg.batch_size, 28, 28), dtype=np.uint8)  # the model normalizes
        y = rng.integers(0, 10, cfg.batch_size).astype(np.int32)
        return ex, lambda backend: ex.CNN(cfg, backend, nnx.Rngs(0)), (x, y)
    import train_lm as ex

    cfg = ex.SIZES[size]
    tokens = rng.integers(0, ex.VOCAB, (cfg.batch_size, cfg.context + 1)).astype(np.int32)
    return ex, lambda backend: ex.TransformerLM(cfg, backend, nnx.Rngs(0)), (tokens[:, :-1], tokens[:, 1:])


def gradient_fn(ex, model):
    """jit(state, x, y) -> the loss's gradient, a pure function of the model's state."""
    graphdef, state = nnx.split(model)

    def grads(state, x, y):
        return nnx.grad(ex.loss_fn)(nnx.merge(graphdef, state), x, y)

    return jax.jit(grads), state


def kernel_medians(fn, args, iterations):
    """{kernel name: median ms per call of fn, summed over its launches}, in first-launch order."""
    from jax.experimental.mosaic.gpu import profiler

    _, per_iter = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    sums = []
    for launches in per_iter:
        total = collections.defaultdict(float)
        for name, ms in launches:
            total[name] += ms
        sums.append(total)
    names = list(dict.fromkeys(name for name, _ in per_iter[0]))
    return {name: statistics.median(s.get(name, 0.0) for s in sums) for name in names}


def show(backend, times, top):
    total = sum(times.values())
    ours = sum(ms for name, ms in times.items() if "jaxgemm" in name)
    print(f"\n{backend}: {total:.3f} ms in {len(times)} kernels" + (f" ({ours:.3f} ms jaxgemm's)" if ours else ""))
    for name, ms in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {ms:8.3f} ms  {ms / total:5.1%}  {name[:110]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", choices=("cnn", "lm"), default="cnn")
    parser.add_argument("--size", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--check", action="store_true", help="run each gradient once, no timing")
    args = parser.parse_args(argv)
    if not args.check and jax.default_backend() != "gpu":
        sys.exit(f"example_kernels: CUPTI times need a GPU (JAX's backend here: {jax.default_backend()}); "
                 "--check runs the gradients once anywhere")
    ex, make_model, (x, y) = example_inputs(args.example, args.size)
    x, y = jnp.asarray(x), jnp.asarray(y)
    grads = {}
    for backend in ("jaxgemm", "xla"):
        fn, state = gradient_fn(ex, make_model(backend))
        if args.check:
            grads[backend] = [np.asarray(g, np.float64) for g in jax.tree.leaves(fn(state, x, y))]
        else:
            show(backend, kernel_medians(fn, (state, x, y), args.iterations), args.top)
    if args.check:  # the same parameters and batch: the same gradients, to the dtype's rounding
        pairs = zip(grads["jaxgemm"], grads["xla"])
        worst = max(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30) for a, b in pairs)
        print(f"{len(grads['xla'])} gradients; largest relative difference jaxgemm / xla {worst:.1e}")
        if not np.isfinite(worst) or worst > 0.05:
            sys.exit(1)


if __name__ == "__main__":
    main()
