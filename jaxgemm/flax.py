"""Flax NNX layers on jaxgemm's fused kernels: drop-in `nnx.Linear` and `nnx.Conv`.

`jaxgemm.flax.Linear` and `jaxgemm.flax.Conv` take `flax.nnx.Linear`'s and
`flax.nnx.Conv`'s constructor arguments (same names, defaults and initializers), create the
same parameters (`kernel`, `bias`: names, shapes, dtypes, and values for the same `rngs`),
and compute the same function, on `jaxgemm.dense` and `jaxgemm.conv2d` instead of
`lax.dot_general` and `lax.conv_general_dilated`. A model's state therefore moves between
the Flax layers and these unchanged::

    import jax, jax.numpy as jnp
    from flax import nnx
    import jaxgemm.flax as jf

    theirs = nnx.Linear(256, 512, rngs=nnx.Rngs(0))
    ours = jf.Linear(256, 512, activation="gelu", rngs=nnx.Rngs(1))
    nnx.update(ours, nnx.state(theirs))      # ours(x) == jax.nn.gelu(theirs(x))

    conv = jf.Conv(64, 128, (3, 3), strides=2, activation=jax.nn.relu, rngs=nnx.Rngs(0))
    y = conv(jnp.ones((8, 32, 32, 64)))       # NHWC -> (8, 16, 16, 128)

Both add one argument the Flax layers lack, `activation`: None, a name from
`jaxgemm.ACTIVATIONS` ("relu", "gelu" (tanh form), "gelu_exact", "silu", "sigmoid",
"tanh"), or the jax.nn function of one, as `jaxgemm.dense` and `jaxgemm.conv2d` take it
(`jax.nn.relu`, `jax.nn.gelu` (approximate=True, its default; `functools.partial(
jax.nn.gelu, approximate=False)` is "gelu_exact"), `jax.nn.silu` / `jax.nn.swish`,
`jax.nn.sigmoid`, `jnp.tanh`). It is applied in the kernel's float32 epilogue, after the
bias, and its gradient runs jaxgemm's fused backward kernel. Any other function is a
TypeError at construction: apply it to the layer's output instead. `Linear` also takes
`fp8="rowwise"`, `"blockwise"` or `"delayed"`: the layer then runs on `jaxgemm.fp8.dense`
(e4m3 products forward and backward, the parameters kept in `param_dtype`). "delayed"
keeps its amax histories in an `Fp8History` variable, which a training step updates from
its gradient instead of the optimizer::

    grad = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, jf.FP8_TRAINABLE))
    loss, grads = grad(model, batch)
    optimizer.update(model, jf.write_fp8_histories(model, grads))

Like every jaxgemm op, the layers work under `nnx.jit`, `nnx.grad`, `nnx.vmap`,
`nnx.scan`, `nnx.remat` and sharded `jit`. Importing this module needs flax
(`pip install jaxgemm[flax]`); `import jaxgemm` alone does not.
"""

from __future__ import annotations

import typing as tp
from types import MappingProxyType

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn import dtypes as _nnx_dtypes
from flax.nnx.nn import initializers
from jax import lax

from jaxgemm import activations
from jaxgemm import fp8 as fp8_layer
from jaxgemm.conv import conv2d
from jaxgemm.nn import dense

__all__ = ["Conv", "FP8_TRAINABLE", "Fp8History", "Linear", "write_fp8_histories"]


class Fp8History(nnx.Variable):
    """A Linear(fp8="delayed") layer's amax histories, float32 (3, H): rows x, w and dz
    (jaxgemm.fp8.AmaxHistory). Its gradient is the updated history, not a gradient."""


# What a training step differentiates: the parameters and the fp8 histories.
FP8_TRAINABLE = nnx.Any(nnx.Param, Fp8History)


def write_fp8_histories(model, grads):
    """Writes the Fp8History entries of `grads` (the updated histories) into `model` and
    returns the rest (the parameters' gradients, for the optimizer)."""
    # (nnx.split_state where Flax has it: State.split warns that it is going away.)
    split = getattr(nnx, "split_state", None) or nnx.State.split
    histories, rest = split(grads, Fp8History, ...)
    nnx.update(model, histories)
    return rest

# nnx.Linear's and nnx.Conv's default initializers (the same objects where flax has them).
try:
    from flax.nnx.nn.linear import default_bias_init, default_kernel_init
except ImportError:  # pragma: no cover - other flax layouts
    default_kernel_init = initializers.lecun_normal()
    default_bias_init = initializers.zeros_init()


def _activation(activation) -> str | None:
    """The fused epilogue's name for None, a name or a jax.nn function (ValueError for an
    unknown name, TypeError for a function without a fused form)."""
    return activations.canonical(activation)


class Linear(nnx.Module):
    """`flax.nnx.Linear` on `jaxgemm.dense`, with an optional fused activation.

    Arguments, parameters (`kernel` (in_features, out_features), `bias` (out_features,)),
    their initialization and the computation are `nnx.Linear`'s: the inputs, kernel and
    bias are promoted by `promote_dtype` to `dtype` (default: inferred from the inputs and
    parameters), and `y = inputs @ kernel + bias` over the last axis, any leading axes
    being batch axes. What differs:

    - `activation`: None, a name ("relu", "gelu", "gelu_exact", "silu", "sigmoid", "tanh")
      or a JAX function with a fused form (`jax.nn.relu`, `jax.nn.gelu`, `jax.nn.silu`,
      `jax.nn.sigmoid`, `jnp.tanh`); `y = activation(inputs @ kernel + bias)`, computed in
      one kernel (the bias and activation in its float32 epilogue, rounded once to the
      output dtype). The attribute `activation` holds the name.
    - The product runs on `jaxgemm.dense` (float32, float16 or bfloat16, accumulated in
      float32). `precision=None` computes float32 exactly (XLA's default may use tf32 on
      GPUs); `"tensorfloat32"` or `lax.Precision.DEFAULT` / `HIGH` allow tf32.
      `preferred_element_type` is `jaxgemm.dense`'s `out_dtype` (the computation dtype or
      float32).
    - `fp8`: None, or "rowwise" / "blockwise" / "delayed" to run the layer on
      `jaxgemm.fp8.dense` with that scaling: the forward and both backward products in
      float8 e4m3, the parameters kept in `param_dtype` as the high-precision copy the
      optimizer updates (`precision` then does not apply). "delayed" adds the variable
      `fp8_history` (Fp8History, `fp8_history` steps long, 16 by default; the module
      docstring shows the training step that updates it). `fp8_grad_format`: the
      backward's dz in "e4m3" (None: the default) or "e5m2" (TransformerEngine's HYBRID
      recipe).
    - There is no `dot_general` argument: the point of the layer is the op it runs on.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        dtype: tp.Any | None = None,
        param_dtype: tp.Any = jnp.float32,
        precision: tp.Any = None,
        kernel_init: tp.Callable = default_kernel_init,
        bias_init: tp.Callable = default_bias_init,
        promote_dtype: tp.Callable = _nnx_dtypes.promote_dtype,
        preferred_element_type: tp.Any | None = None,
        activation: str | tp.Callable | None = None,
        fp8: str | None = None,
        fp8_history: int | None = None,
        fp8_grad_format: str | None = None,
        rngs: nnx.Rngs,
        kernel_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
        bias_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
    ):
        activation = _activation(activation)
        if fp8 is not None and fp8 not in fp8_layer.SCALINGS:
            raise ValueError(f"jaxgemm.flax.Linear: fp8 must be None or one of {fp8_layer.SCALINGS}, got {fp8!r}")
        if fp8_history is not None and fp8 != "delayed":
            raise ValueError(f"jaxgemm.flax.Linear: fp8_history is fp8='delayed''s; fp8={fp8!r} takes none")
        if fp8_grad_format is not None and (fp8 is None or fp8_grad_format not in fp8_layer.GRAD_FORMATS):
            raise ValueError(f"jaxgemm.flax.Linear: fp8_grad_format must be None or one of "
                             f"{tuple(fp8_layer.GRAD_FORMATS)} with an fp8 scaling, got {fp8_grad_format!r} "
                             f"with fp8={fp8!r}")  # fmt: skip
        # As nnx.Linear: the kernel's key first, then the bias's.
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype), **kernel_metadata)
        self.bias: nnx.Param[jax.Array] | None
        if use_bias:
            self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype), **bias_metadata)
        else:
            self.bias = nnx.data(None)
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.promote_dtype = promote_dtype
        self.preferred_element_type = preferred_element_type
        self.activation = activation
        self.fp8 = fp8
        self.fp8_grad_format = fp8_grad_format or "e4m3"
        if fp8 == "delayed":
            self.fp8_history = Fp8History(jnp.stack(fp8_layer.amax_history(16 if fp8_history is None else fp8_history)))

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        """`activation(inputs @ kernel + bias)` over the last axis of `inputs`.

        Args:
          inputs: (..., in_features) array.
          out_sharding: the result's sharding, as for `nnx.Linear` (see `jaxgemm.dense`).

        Returns:
          (..., out_features) array.
        """
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        if self.fp8 is not None:
            history = fp8_layer.AmaxHistory(*self.fp8_history[...]) if self.fp8 == "delayed" else None
            return fp8_layer.dense(inputs, kernel, bias, self.activation, out_dtype=self.preferred_element_type,
                                   scaling=self.fp8, history=history, grad_format=self.fp8_grad_format,
                                   out_sharding=out_sharding)  # fmt: skip
        return dense(
            inputs,
            kernel,
            bias,
            activation=self.activation,
            precision=self.precision,
            out_dtype=self.preferred_element_type,
            out_sharding=out_sharding,
        )


def _spatial_pair(value, name: str) -> tuple[int, int]:
    """nnx.Conv's int-or-sequence (None meaning 1) argument, for two spatial dims."""
    if value is None:
        value = 1
    if isinstance(value, (int, np.integer)):
        return (int(value),) * 2
    try:
        pair = tuple(int(v) for v in value)
    except TypeError:
        pair = ()
    if len(pair) != 2:
        raise ValueError(
            f"jaxgemm.flax.Conv: {name}={value!r} does not describe a 2-D convolution (an int or 2 ints); "
            "jaxgemm.conv2d computes 2-D convolutions only"
        )
    return pair


_STRING_PADDINGS = ("SAME", "VALID", "SAME_LOWER")
_PADDING_MODES = {"CIRCULAR": "wrap", "REFLECT": "reflect"}


def _check_padding(padding):
    """nnx.Conv's padding forms that a 2-D jaxgemm convolution computes."""
    if isinstance(padding, str):
        if padding.upper() in _STRING_PADDINGS:  # lax's padding types, any case
            return padding.upper()
        if padding in _PADDING_MODES:  # as nnx.Conv, only in capitals
            return padding
        raise ValueError(
            f"jaxgemm.flax.Conv: padding={padding!r} is not supported; use 'SAME', 'VALID', 'SAME_LOWER', "
            "'CIRCULAR', 'REFLECT', an int, or 2 ints or (low, high) pairs ('CAUSAL' is for 1-D convolutions)"
        )
    if isinstance(padding, (int, np.integer)):
        return ((int(padding),) * 2,) * 2
    if isinstance(padding, tp.Sequence) and len(padding) == 2:
        pads = []
        for p in padding:
            if isinstance(p, (int, np.integer)):
                pads.append((int(p), int(p)))
            elif isinstance(p, tp.Sequence) and len(p) == 2 and all(isinstance(v, (int, np.integer)) for v in p):
                pads.append((int(p[0]), int(p[1])))
            else:
                break
        else:
            return tuple(pads)
    raise ValueError(
        f"jaxgemm.flax.Conv: padding={padding!r} is not a 2-D padding: use a string, an int, or a sequence of "
        "2 ints or (low, high) pairs"
    )


class Conv(nnx.Module):
    """`flax.nnx.Conv` for 2-D NHWC inputs on `jaxgemm.conv2d`, with an optional fused activation.

    Arguments, parameters (`kernel` (kh, kw, in_features // feature_group_count,
    out_features), `bias` (out_features,)), their initialization and the computation are
    `nnx.Conv`'s with a 2-D `kernel_size`: inputs (*batch, H, W, C), where any number of
    leading batch axes (none included) are folded into one around the call; promotion to
    `dtype` by `promote_dtype`; `strides`, `kernel_dilation`, `feature_group_count`,
    `mask` and every 2-D `padding` (strings "SAME", "VALID", "SAME_LOWER", "CIRCULAR",
    "REFLECT", an int, or two ints or (low, high) pairs). What differs:

    - `activation`: as for `Linear`: `y = activation(conv(inputs, kernel) + bias)`, in the
      kernel's float32 epilogue. The attribute `activation` holds the name.
    - The convolution runs on `jaxgemm.conv2d` (float32, float16 or bfloat16, accumulated
      in float32; float32 is computed exactly whatever `precision` says, which is kept
      only for compatibility). `preferred_element_type` is its `out_dtype`.
    - Only 2-D convolutions: a `kernel_size` of another length (an int is a 1-D kernel in
      `nnx.Conv`), `input_dilation` other than 1 (a transposed convolution: use
      `nnx.ConvTranspose`), or "CAUSAL" padding (1-D) are a ValueError at construction.
      There is no `conv_general_dilated` argument.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int | tp.Sequence[int],
        strides: None | int | tp.Sequence[int] = 1,
        *,
        padding: tp.Any = "SAME",
        input_dilation: None | int | tp.Sequence[int] = 1,
        kernel_dilation: None | int | tp.Sequence[int] = 1,
        feature_group_count: int = 1,
        use_bias: bool = True,
        mask: jax.Array | None = None,
        dtype: tp.Any | None = None,
        param_dtype: tp.Any = jnp.float32,
        precision: tp.Any = None,
        kernel_init: tp.Callable = default_kernel_init,
        bias_init: tp.Callable = default_bias_init,
        promote_dtype: tp.Callable = _nnx_dtypes.promote_dtype,
        preferred_element_type: tp.Any | None = None,
        activation: str | tp.Callable | None = None,
        rngs: nnx.Rngs,
        kernel_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
        bias_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
    ):
        kernel_size = (kernel_size,) if isinstance(kernel_size, (int, np.integer)) else tuple(kernel_size)
        if len(kernel_size) != 2:
            raise ValueError(
                f"jaxgemm.flax.Conv: kernel_size={kernel_size!r} describes a {len(kernel_size)}-D convolution "
                "(an int is a 1-D kernel in nnx.Conv); jaxgemm.conv2d computes 2-D ones: pass (kh, kw)"
            )
        kernel_size = tuple(int(k) for k in kernel_size)
        _spatial_pair(strides, "strides")
        _spatial_pair(kernel_dilation, "kernel_dilation")
        if _spatial_pair(input_dilation, "input_dilation") != (1, 1):
            raise ValueError(
                f"jaxgemm.flax.Conv: input_dilation={input_dilation!r} is not supported (jaxgemm.conv2d has no "
                "input dilation); only 1. For a transposed convolution use nnx.ConvTranspose"
            )
        _check_padding(padding)
        if not isinstance(feature_group_count, (int, np.integer)) or feature_group_count < 1:
            raise ValueError(
                f"jaxgemm.flax.Conv: feature_group_count must be a positive int, got {feature_group_count!r}"
            )
        if in_features % feature_group_count or out_features % feature_group_count:
            raise ValueError(
                f"jaxgemm.flax.Conv: feature_group_count={feature_group_count} must divide in_features="
                f"{in_features} and out_features={out_features}"
            )
        activation = _activation(activation)

        kernel_shape = kernel_size + (in_features // feature_group_count, out_features)
        self.kernel_shape = kernel_shape
        self.kernel = nnx.Param(kernel_init(rngs.params(), kernel_shape, param_dtype), **kernel_metadata)
        self.bias: nnx.Param[jax.Array] | None
        if use_bias:
            self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype), **bias_metadata)
        else:
            self.bias = nnx.data(None)
        self.in_features = in_features
        self.out_features = out_features
        self.kernel_size = kernel_size
        self.strides = strides
        self.padding = padding
        self.input_dilation = input_dilation
        self.kernel_dilation = kernel_dilation
        self.feature_group_count = feature_group_count
        self.use_bias = use_bias
        self.mask = mask
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.promote_dtype = promote_dtype
        self.preferred_element_type = preferred_element_type
        self.activation = activation

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        """`activation(conv(inputs, kernel) + bias)`.

        Args:
          inputs: (*batch, H, W, in_features) array; the batch axes (any number, none
            included) are folded into one for the convolution and restored after it.
          out_sharding: the (folded) result's sharding, as for `nnx.Conv` (see
            `jaxgemm.conv2d`).

        Returns:
          (*batch, P, Q, out_features) array.
        """
        inputs = jnp.asarray(inputs)
        if inputs.ndim < 3:
            raise ValueError(
                f"jaxgemm.flax.Conv: inputs must be (*batch, H, W, C) for a 2-D convolution, got shape {inputs.shape}"
            )
        batch_shape = inputs.shape[:-3]
        if len(batch_shape) != 1:
            inputs = jnp.reshape(inputs, (-1,) + inputs.shape[-3:])

        strides = _spatial_pair(self.strides, "strides")
        dilation = _spatial_pair(self.kernel_dilation, "kernel_dilation")
        padding = _check_padding(self.padding)
        if isinstance(padding, str):
            eff = [(k - 1) * d + 1 for k, d in zip(self.kernel_size, dilation)]
            if padding in _PADDING_MODES:  # as nnx.Conv: pad the input, then a VALID convolution
                pads = [(0, 0)] + [((k - 1) // 2, k // 2) for k in eff] + [(0, 0)]
                inputs = jnp.pad(inputs, pads, mode=_PADDING_MODES[padding])
                padding = ((0, 0), (0, 0))
            else:
                pads = lax.padtype_to_pads(inputs.shape[1:3], eff, strides, padding)
                padding = tuple((int(lo), int(hi)) for lo, hi in pads)

        if self.mask is not None and self.mask.shape != self.kernel_shape:
            raise ValueError(
                f"Mask needs to have the same shape as weights. Shapes are: {self.mask.shape}, {self.kernel_shape}"
            )
        kernel = self.kernel[...]
        if self.mask is not None:
            kernel = kernel * self.mask
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)

        y = conv2d(
            inputs,
            kernel,
            stride=strides,
            padding=padding,
            dilation=dilation,
            groups=int(self.feature_group_count),
            bias=bias,
            activation=self.activation,
            out_dtype=self.preferred_element_type,
            out_sharding=out_sharding,
        )
        if len(batch_shape) != 1:
            y = jnp.reshape(y, batch_shape + y.shape[1:])
        return y
