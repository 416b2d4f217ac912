"""FLOP cost model: how expensive it is to recompute each equation of a jaxpr.

The planner charges a checkpoint plan for the equations it makes the backward pass
re-run. :class:`FlopCostModel` is the default price list:

* ``dot_general`` and ``conv_general_dilated`` cost exactly what XLA's
  ``cost_analysis()['flops']`` reports for unpadded inputs (2 FLOPs per
  multiply-accumulate);
* elementwise primitives cost one FLOP per output element; transcendental ones
  (``exp``, ``tanh``, ``erf``, ...) are *not* weighted more than ``add``;
* reductions (``reduce_sum``, ``argmax``, ``cumsum``, ...) cost one FLOP per input
  element;
* data movement and metadata (``reshape``, ``transpose``, ``slice``, ``gather``,
  ``convert_element_type``, the ``name`` primitive of ``checkpoint_name``, ...) is free,
  and so is a ``reduce_precision`` to its operand's own format (the no-op
  ``jax.checkpoint`` inserts against CSE);
* higher-order primitives are priced by what they run: ``jit``, calls, ``remat2``
  (``jax.checkpoint``) and custom-derivative calls by their body, ``cond`` by its most
  expensive branch, ``scan`` by ``length`` times its body and ``while`` by one body
  plus one condition, since its trip count is unknown when tracing;
* any other primitive costs one FLOP per output element, plus the FLOPs of any
  sub-jaxprs it carries. Pricing never raises on an unknown primitive.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(jnp.matmul)(jnp.ones((8, 4)), jnp.ones((4, 2)))
    >>> jaxpr_flops(closed)
    128
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import jax.numpy as jnp
from jax.extend import source_info_util
from jax.extend.core import ClosedJaxpr, InconclusiveDimensionOperation, Jaxpr, JaxprEqn
from jax.extend.core import jaxprs_in_params as _jaxprs_in_params

from remat_opt._errors import UnsupportedProgramError

if TYPE_CHECKING:
    from jax.core import ShapedArray

__all__ = ["CostModel", "FlopCostModel", "jaxpr_flops"]


@runtime_checkable
class CostModel(Protocol):
    """Anything that can price one jaxpr equation in FLOPs."""

    def eqn_flops(self, eqn: JaxprEqn) -> int:
        """Returns the cost of running ``eqn`` once, in FLOPs (``>= 0``)."""
        ...


ELEMENTWISE_PRIMITIVES: frozenset[str] = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e
    cbrt ceil clamp clz complex conj cos cosh digamma div eq eq_to erf erf_inv erfc exp
    exp2 expm1 floor ge gt igamma igamma_grad_a igammac integer_pow is_finite le le_to
    lgamma log log1p logistic lt lt_to max min mul mulhi ne neg nextafter not one_minus_square
    or polygamma population_count pow random_gamma_grad reduce_precision regularized_incomplete_beta
    rem round rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign
    sin sinh sqrt square sub tan tanh xor zeta""".split()
)
"""Primitives priced at one FLOP per output element. ``one_minus_square`` (``1 - x²``, new in
jax 0.12, where ``tanh``'s JVP uses it) is a standard unary op there, like ``square``."""

REDUCTION_PRIMITIVES: frozenset[str] = frozenset(
    """argmax argmin cumlogsumexp cummax cummin cumprod cumsum reduce reduce_and
    reduce_max reduce_min reduce_or reduce_prod reduce_sum reduce_xor""".split()
)
"""Primitives priced at one FLOP per element of their (first) input."""

FREE_PRIMITIVES: frozenset[str] = frozenset(
    """after_all axis_index bitcast_convert_type broadcast_in_dim concatenate
    convert_element_type copy copy_p create_token device_put dynamic_slice
    dynamic_update_slice empty expand_dims gather imag iota layout_constraint mesh_cast
    name optimization_barrier pad platform_index pvary real reshape reshard rev scatter
    sharding_constraint slice split squeeze stop_gradient transpose zeros_like""".split()
)
"""Data movement and metadata primitives, priced at zero."""

# Priced at output elements times window size, and at update elements, respectively.
_WINDOW_PRIMITIVES = frozenset(f"reduce_window{op}" for op in ("", "_max", "_min", "_sum"))
_SCATTER_COMBINE_PRIMITIVES = frozenset(f"scatter-{op}" for op in "add sub mul min max".split())

# Call-like primitives priced as their body, and the parameter(s) holding it, in order
# of preference. In jax 0.10.2 `jax.jit` binds the primitive "jit" (formerly "pjit"),
# `jax.checkpoint` binds "remat2" (an open Jaxpr), custom_jvp/custom_vjp bind
# "custom_jvp_call"/"custom_vjp_call" with "call_jaxpr", and custom_vjp's
# `optimize_remat=True` binds a primitive literally named "remat_opt" ("fwd_jaxpr").
_CALL_PARAMS: dict[str, tuple[str, ...]] = {
    "jit": ("jaxpr",),
    "pjit": ("jaxpr",),
    "closed_call": ("call_jaxpr",),
    "core_call": ("call_jaxpr",),
    "remat2": ("jaxpr",),
    "checkpoint": ("jaxpr",),
    "remat": ("jaxpr",),
    "custom_jvp_call": ("call_jaxpr", "fun_jaxpr"),
    "custom_jvp_call_jaxpr": ("fun_jaxpr", "call_jaxpr"),
    "custom_vjp_call": ("call_jaxpr", "fun_jaxpr"),
    "custom_vjp_call_jaxpr": ("fun_jaxpr", "call_jaxpr"),
    "remat_opt": ("fwd_jaxpr",),
    "linear_call": ("callee",),
    "custom_lin": ("jaxpr",),
}


def known_calls() -> frozenset[str]:
    """Primitives priced by a rule of their own (calls, loops, dots, convolutions, windows, scatters)."""
    return frozenset(_CALL_PARAMS) | _WINDOW_PRIMITIVES | _SCATTER_COMBINE_PRIMITIVES | frozenset(
        {"dot_general", "conv_general_dilated", "cond", "scan", "while"})


def _as_jaxpr(value: object) -> Jaxpr | None:
    if isinstance(value, ClosedJaxpr):
        return value.jaxpr
    if isinstance(value, Jaxpr):
        return value
    return None


def _num_elements(aval: Any) -> int:
    """Number of elements of an abstract value; 0 for shapeless ones (tokens, refs)."""
    shape = getattr(aval, "shape", None)
    if shape is None:
        return 0
    return _prod(shape)


class _SymbolicDimensionError(Exception):
    """Internal: a count needed a concrete size but found a symbolic dimension."""


def _prod(dims: Iterable[Any]) -> int:
    dims = tuple(dims)
    try:
        return math.prod(int(d) for d in dims)
    except (TypeError, ValueError, InconclusiveDimensionOperation) as err:
        raise _SymbolicDimensionError(dims) from err


def _source_of(eqn: JaxprEqn) -> str | None:
    try:
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 - a location is a nicety, never worth failing over.
        return None


def _out_elements(eqn: JaxprEqn) -> int:
    return sum(_num_elements(v.aval) for v in eqn.outvars)


@dataclass(frozen=True)
class FlopCostModel:
    """The default cost model: FLOPs as XLA counts them for matmuls and convolutions.

    See the module docstring for the price of each kind of primitive. Sub-jaxprs of
    higher-order primitives are priced with this same model.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> eqn = jax.make_jaxpr(jnp.exp)(jnp.ones((3, 5))).eqns[0]
        >>> FlopCostModel().eqn_flops(eqn)
        15
    """

    def eqn_flops(self, eqn: JaxprEqn) -> int:
        """Prices one equation.

        Args:
            eqn: A jaxpr equation (``jax.extend.core.JaxprEqn``).

        Returns:
            The FLOPs of running ``eqn`` once, ``>= 0``.

        Raises:
            UnsupportedProgramError: if an operand has a symbolic (shape-polymorphic)
                dimension the count depends on.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> eqn = jax.make_jaxpr(jnp.sum)(jnp.ones((4, 6))).eqns[0]
            >>> FlopCostModel().eqn_flops(eqn)
            24
        """
        try:
            return self._price(eqn)
        except _SymbolicDimensionError as err:
            raise UnsupportedProgramError(
                eqn.primitive.name,
                _source_of(eqn),
                f"FLOP counting needs concrete array shapes; got dimensions {err.args[0]!r}. "
                "Trace the function with concrete shapes, not jax.export symbolic ones.",
            ) from err

    def _price(self, eqn: JaxprEqn) -> int:
        name = eqn.primitive.name
        params = eqn.params
        if name in FREE_PRIMITIVES or (name == "reduce_precision" and _is_identity_rounding(eqn)):
            return 0
        if name in ELEMENTWISE_PRIMITIVES:
            return _out_elements(eqn)
        if name == "dot_general":
            return _dot_general_flops(eqn)
        if name == "conv_general_dilated":
            return _conv_flops(eqn)
        if name in REDUCTION_PRIMITIVES:
            return _num_elements(eqn.invars[0].aval) if eqn.invars else 0
        if name in _WINDOW_PRIMITIVES:
            return _out_elements(eqn) * _prod(params.get("window_dimensions", ()))
        if name in _SCATTER_COMBINE_PRIMITIVES and len(eqn.invars) >= 3:
            return _num_elements(eqn.invars[2].aval)
        if name in _CALL_PARAMS:
            for key in _CALL_PARAMS[name]:
                body = _as_jaxpr(params.get(key))
                if body is not None:
                    return jaxpr_flops(body, self)
        if name == "cond":
            return max((jaxpr_flops(b, self) for b in params.get("branches", ())), default=0)
        if name == "scan" and _as_jaxpr(params.get("jaxpr")) is not None:
            return int(params.get("length", 1)) * jaxpr_flops(params["jaxpr"], self)
        if name == "while":
            # The trip count is data-dependent, so one iteration is priced.
            return sum(
                jaxpr_flops(params[key], self)
                for key in ("cond_jaxpr", "body_jaxpr")
                if _as_jaxpr(params.get(key)) is not None
            )
        # Unknown primitive: one FLOP per output element plus whatever it runs inside.
        return _out_elements(eqn) + sum(jaxpr_flops(sub, self) for sub in _jaxprs_in_params(params))


def _is_identity_rounding(eqn: JaxprEqn) -> bool:
    """A ``reduce_precision`` to its operand's own format: the no-op that
    ``jax.checkpoint`` inserts to keep XLA from merging a recomputation with
    the forward, and that XLA then compiles to nothing."""
    dtype = getattr(eqn.invars[0].aval, "dtype", None)
    try:
        info = jnp.finfo(dtype)
    except (TypeError, ValueError):
        return False
    return (eqn.params.get("exponent_bits"), eqn.params.get("mantissa_bits")) == (info.nexp, info.nmant)


def _dot_general_flops(eqn: JaxprEqn) -> int:
    """2 * batch * lhs-free * rhs-free * contracting, from ``dimension_numbers``."""
    lhs_shape = cast("ShapedArray", eqn.invars[0].aval).shape
    rhs_shape = cast("ShapedArray", eqn.invars[1].aval).shape
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    lhs_used = set(lhs_contract) | set(lhs_batch)
    rhs_used = set(rhs_contract) | set(rhs_batch)
    batch = _prod(lhs_shape[d] for d in lhs_batch)
    contracting = _prod(lhs_shape[d] for d in lhs_contract)
    lhs_free = _prod(n for d, n in enumerate(lhs_shape) if d not in lhs_used)
    rhs_free = _prod(n for d, n in enumerate(rhs_shape) if d not in rhs_used)
    return 2 * batch * lhs_free * rhs_free * contracting


def _conv_flops(eqn: JaxprEqn) -> int:
    """2 * output elements * kernel input features * kernel spatial size.

    The kernel's input-feature dimension already equals the input's feature count
    divided by ``feature_group_count``. With ``batch_group_count`` > 1 it equals the
    full input feature count while the output batch shrinks, so the same formula
    holds. Taps that fall on padding are counted, as in a dense convolution; XLA's
    ``cost_analysis`` skips them, so it reports less for ``padding='SAME'``.
    """
    rhs_shape = cast("ShapedArray", eqn.invars[1].aval).shape
    dimension_numbers = eqn.params.get("dimension_numbers")
    if dimension_numbers is None:  # lax default: NC..., OI..., NC...
        rhs_spec = tuple(range(len(rhs_shape)))
    else:
        rhs_spec = tuple(dimension_numbers.rhs_spec)
    in_features = int(rhs_shape[rhs_spec[1]])
    kernel_spatial = _prod(rhs_shape[d] for d in rhs_spec[2:])
    return 2 * _out_elements(eqn) * in_features * kernel_spatial


def jaxpr_flops(jaxpr: Jaxpr | ClosedJaxpr, cost_model: CostModel | None = None) -> int:
    """Sums the cost of every equation of a jaxpr, recursing into higher-order ones.

    Args:
        jaxpr: A ``Jaxpr`` or ``ClosedJaxpr``, e.g. from ``jax.make_jaxpr(f)(*args)``.
        cost_model: How to price each equation; defaults to :class:`FlopCostModel`.

    Returns:
        The total FLOPs of running the jaxpr once.

    Raises:
        TypeError: if ``jaxpr`` is not a jaxpr or ``cost_model`` has no ``eqn_flops``.
        UnsupportedProgramError: if the cost model cannot price an equation.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda a, b: jnp.tanh(a @ b)
        >>> jaxpr_flops(jax.make_jaxpr(f)(jnp.ones((8, 4)), jnp.ones((4, 2))))
        144
    """
    body = _as_jaxpr(jaxpr)
    if body is None:
        raise TypeError(
            f"jaxpr must be a jax.extend.core.Jaxpr or ClosedJaxpr, such as "
            f"jax.make_jaxpr(f)(*args); got {jaxpr!r:.80} ({type(jaxpr).__name__})."
        )
    if cost_model is None:
        cost_model = _DEFAULT_MODEL
    elif not callable(getattr(cost_model, "eqn_flops", None)):
        raise TypeError(
            f"cost_model must have an eqn_flops(eqn) -> int method, like FlopCostModel(); "
            f"got {cost_model!r} ({type(cost_model).__name__})."
        )
    return sum(int(cost_model.eqn_flops(eqn)) for eqn in body.eqns)


_DEFAULT_MODEL = FlopCostModel()


@dataclass(frozen=True)
class Interconnect:
    """What a collective costs, in the FLOPs the planner minimizes.

    In a sharded program, recomputing an equation XLA lowered to a collective
    (an FSDP weight's all-gather) moves its bytes over the devices' links
    again. That takes ``bytes / link_bytes_per_second`` seconds, in which the
    device could have run ``device_flops_per_second`` times as many FLOPs; so
    a collective byte costs ``device_flops_per_second / link_bytes_per_second``
    FLOPs (:attr:`flops_per_byte`).

    The defaults, 100 GB/s per link and 100 TFLOP/s per device (1000 FLOPs
    per byte), are the order of one TPU v4 ICI link or a PCIe-class GPU link
    against a bf16 matmul unit; set them for your machine.

    Attributes:
        link_bytes_per_second: bandwidth of one device's link, bytes per second.
        device_flops_per_second: the device's compute rate, FLOPs per second.

    Example:
        >>> Interconnect(link_bytes_per_second=400e9).flops_of(1_000_000)
        250000000
    """

    link_bytes_per_second: float = 100e9
    device_flops_per_second: float = 100e12

    def __post_init__(self) -> None:
        for name in ("link_bytes_per_second", "device_flops_per_second"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number; got {value!r}.")

    @property
    def flops_per_byte(self) -> float:
        return self.device_flops_per_second / self.link_bytes_per_second

    def flops_of(self, collective_bytes: int) -> int:
        """The FLOPs the device could run while ``collective_bytes`` cross its link."""
        return round(collective_bytes * self.flops_per_byte)
