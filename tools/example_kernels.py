"""Where an example's training step spends its GPU time: per-kernel CUPTI times of the
gradient (forward + backward) of examples/train_cnn.py's or train_lm.py's model, jaxgemm's
backend and XLA's on the same parameters and batch, kernels named and summed per name
(median over iterations). The optimizer's update is the same on both sides and left out.
    python3 -P tools/example_kernels.py [--example cnn|lm] [--size gpu|cpu] [--iterations 20] [--top 20]
        [--backends jaxgemm,xla]
`--backends` takes any of the example's backends (e.g. jaxgemm,fp8-delayed for the LM's fp8
recipe against bf16; a delayed recipe's gradient includes its amax histories, as in training).
`--check` runs each gradient once without timing (any machine; what the tests run) and
compares the first two backends' gradients.
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

import jaxgemm.flax as jf

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
    """jit(state, x, y) -> the loss's gradient, a pure function of the model's state (the
    gradient holds the fp8 recipes' updated amax histories too, as update_step's), and the
    model's state."""
    graphdef, state = nnx.split(model)

    def grads(state, x, y):
        wrt = nnx.DiffState(0, jf.FP8_TRAINABLE)
        return nnx.grad(ex.loss_fn, argnums=wrt)(nnx.merge(graphdef, state), x, y)

    return jax.jit(grads), state


def warmed_gradient_fn(ex, model, x, y, steps=1):
    """gradient_fn after `steps` steps that write the amax histories back. A delayed recipe's
    first step quantizes at scale 1 (its gradients flush), and a layer's gradient amax is
    right only once the layers after it had right scales: one step more per layer deep."""
    fn, state = gradient_fn(ex, model)
    if not nnx.state(model, jf.Fp8History):
        return fn, state
    for _ in range(steps):
        jf.write_fp8_histories(model, fn(state, x, y))
        state = nnx.state(model)
    return fn, state


def checked_gradient(ex, model, x, y):
    """The parameters' gradients (after 16 warm-up steps: the history's length) as float64
    arrays."""
    fn, state = warmed_gradient_fn(ex, model, x, y, steps=16)
    params = jf.write_fp8_histories(model, fn(state, x, y))
    return [np.asarray(g, np.float64) for g in jax.tree.leaves(params)]


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
    parser.add_argument("--backends", default="jaxgemm,xla", help="comma-separated backends of the example")
    parser.add_argument("--check", action="store_true", help="run each gradient once, no timing")
    args = parser.parse_args(argv)
    if not args.check and jax.default_backend() != "gpu":
        sys.exit(f"example_kernels: CUPTI times need a GPU (JAX's backend here: {jax.default_backend()}); "
                 "--check runs the gradients once anywhere")
    ex, make_model, (x, y) = example_inputs(args.example, args.size)
    x, y = jnp.asarray(x), jnp.asarray(y)
    backends = args.backends.split(",")
    if len(backends) < (2 if args.check else 1):
        sys.exit(f"example_kernels: --check compares two backends, got --backends {args.backends}")
    grads = {}
    for backend in backends:
        if args.check:
            grads[backend] = checked_gradient(ex, make_model(backend), x, y)
        else:
            fn, state = warmed_gradient_fn(ex, make_model(backend), x, y)
            show(backend, kernel_medians(fn, (state, x, y), args.iterations), args.top)
    if args.check:  # the same parameters and batch: the same gradients, to the inputs' rounding
        first, second = backends[:2]
        tolerance = 0.25 if any(b.startswith("fp8") for b in (first, second)) else 0.05  # (e4m3: 3 mantissa bits)
        pairs = zip(grads[first], grads[second])
        worst = max(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30) for a, b in pairs)
        print(f"{len(grads[second])} gradients; largest relative difference {first} / {second} {worst:.1e}")
        if not np.isfinite(worst) or worst > tolerance:
            sys.exit(1)


if __name__ == "__main__":
    main()
