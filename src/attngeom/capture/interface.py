"""Register, don't patch: one attention function and its mask function (STYLE habit 5).

transformers routes every attention call of a modern model through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` and builds the mask
with ``ALL_MASK_ATTENTION_FUNCTIONS[config._attn_implementation]``. Registering
one name in *both* interfaces and switching the model to it with
``model.set_attn_implementation`` is therefore enough to see, and to change,
every layer's query, key and value states, with no assignment into a model
class or module. The mask function matters: a name missing from the mask
interface makes transformers build no mask at all, and the model silently runs
non-causal.

The function registered here is a dispatcher. ``override_attention(model,
handler)`` puts ``handler`` on a stack keyed by the model's attention modules
(and its config, for the mask), switches the model to the registered name, and
restores the previous implementation on exit. The handler receives an
``AttentionCall`` and can ask it for the output the model's previous
implementation would give (``previous()``, e.g. sdpa) or for the family's own
eager function on any subset of query rows (``eager(rows)``), so scaling,
softcapping, sliding windows and GQA are exactly the model's (method §2, method §11).

The registration itself is global and permanent (transformers has no
unregister); a registered but unused name changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from attngeom.capture.architectures import (
    attention_modules,
    family_eager_function,
    model_class_name,
)
from attngeom.errors import ModelError

IMPLEMENTATION_NAME = "attngeom"
# Mask formats the registered mask function can delegate to unchanged: the
# output of the previous implementation is then computed from exactly the mask
# it would have built itself. Any other implementation (flash, flex) gets a
# materialised boolean mask and its output falls back to the eager function.
_DELEGATED_MASKS = ("sdpa", "eager")

AttentionOutput = tuple[torch.Tensor, torch.Tensor | None]
Handler = Callable[["AttentionCall"], AttentionOutput]


@dataclass
class _Override:
    """One active ``override_attention`` on one model."""

    handler: Handler
    layers: dict[int, int]  # id(attention module) -> layer index
    previous: str  # the implementation the model had on entry
    base: str  # the first implementation below any attngeom override
    below: _Override | None  # the enclosing override of the same model, if nested
    calls: int = 0


# id(attention module) -> stack of overrides; id(config) -> stack of overrides.
_BY_MODULE: dict[int, list[_Override]] = {}
_BY_CONFIG: dict[int, list[_Override]] = {}
_REGISTERED = False


def _min_value(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min


def _rows_index(rows: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if rows is None else rows.to(device=device, dtype=torch.long)


@dataclass
class AttentionCall:
    """One layer's attention call, as the model made it.

    ``query`` (B, H, Q, d), ``key`` and ``value`` (B, G, T, d) (before
    ``repeat_kv``), ``attention_mask`` the mask the model built (boolean for
    sdpa, additive for eager, or ``None`` where sdpa relies on ``is_causal``),
    ``kwargs`` the rest of the interface arguments (``scaling``, ``dropout``,
    ``softcap``, ``sliding_window``, ...).
    """

    module: torch.nn.Module
    layer: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attention_mask: torch.Tensor | None
    kwargs: dict[str, Any]
    _override: _Override = field(repr=False)

    @property
    def num_queries(self) -> int:
        return int(self.query.shape[2])

    @property
    def num_keys(self) -> int:
        return int(self.key.shape[2])

    @property
    def is_causal(self) -> bool:
        """Causality as sdpa would read it: the call's ``is_causal``, else the module's."""
        flag = self.kwargs.get("is_causal")
        if flag is None:
            flag = getattr(self.module, "is_causal", True)
        return bool(flag)

    def visible(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Key visibility (B, 1 or H, Q', T) bool, from the mask the model built.

        Rows of the model's own mask (sliced to ``rows`` when given). Where the
        model built no mask (sdpa's causal or bidirectional skip), visibility is
        the pattern sdpa applies instead: causal aligned to the last key, or all.
        """
        mask = self.attention_mask
        t, q = self.num_keys, self.num_queries
        device = self.query.device
        index = _rows_index(rows, device)
        # only the requested rows are built or compared: one row per window in ``final``
        # mode must not cost a T x T pass
        if mask is None:
            rows_q = torch.arange(q, device=device) if index is None else index
            if self.is_causal:
                vis = torch.arange(t, device=device)[None, :] <= (rows_q + (t - q))[:, None]
            else:
                vis = torch.ones(len(rows_q), t, dtype=torch.bool, device=device)
            return vis[None, None].expand(self.query.shape[0], 1, len(rows_q), t)
        mask = mask[..., :t]
        if index is not None and mask.shape[2] != 1:
            mask = mask.index_select(2, index)
        return mask if mask.dtype == torch.bool else mask > _min_value(mask.dtype) / 2

    def additive_mask(self, rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """The mask in the eager function's additive format (0 or dtype min), rows sliced.

        A boolean mask becomes ``where(mask, 0, finfo(dtype).min)``, exactly what
        transformers' ``eager_mask`` builds; an additive mask is used as it is.
        """
        mask = self.attention_mask
        index = _rows_index(rows, self.query.device)
        if mask is None:
            if not self.is_causal:
                return None
            vis = self.visible(rows)
        elif mask.dtype == torch.bool:
            vis = mask if index is None or mask.shape[2] == 1 else mask.index_select(2, index)
        else:
            if index is None or mask.shape[2] == 1:
                return mask
            return mask.index_select(2, index)
        zero = torch.zeros((), dtype=self.query.dtype, device=vis.device)
        return torch.where(vis, zero, _min_value(self.query.dtype))

    def eager(self, rows: torch.Tensor | None = None, *,
              output: bool = True) -> AttentionOutput:
        """The family's own eager attention on query ``rows`` (all when ``None``).

        Returns ``(output (B, Q', H, d), probabilities (B, H, Q', T))``. Slicing
        queries and mask rows together gives the same rows the full eager call
        gives (method §11). ``output=False``: the probabilities only, the function run
        on zero-width values (its probabilities @ values product costs nothing; the
        returned output is then (B, Q', H, 0)) for callers that recompute the output
        from modified probabilities.
        """
        function = family_eager_function(self.module)
        index = _rows_index(rows, self.query.device)
        query = self.query if index is None else self.query.index_select(2, index)
        kwargs = {k: v for k, v in self.kwargs.items() if k != "is_causal"}
        value = self.value if output else self.value[..., :0]
        return function(
            self.module, query, self.key, value, self.additive_mask(rows), **kwargs
        )

    def eager_float32(
        self, rows: torch.Tensor | None = None, *, output: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``eager(rows)`` plus its probabilities in float32 before any rounding (method §10).

        Returns ``(output, weights, probabilities)``: the first two exactly what
        ``eager`` returns (``output=False`` as there), the last (B, H, Q', T) float32.
        A bf16 or fp16 model computes its softmax in float32 and rounds the
        probabilities to its dtype (then they tie often and the tie rule would pick the
        selected set), or computes it in its own dtype (GPT-2, BERT); either way the
        probabilities here are the float32 softmax of the very scores the family's
        eager function built (scaling, softcapping and
        mask included), recorded as that function calls softmax.
        """
        if self.query.dtype in (torch.float32, torch.float64):
            out, weights = self.eager(rows, output=output)
            return out, weights, weights.to(torch.float32)
        recorder = SoftmaxRecorder()
        with recorder:
            out, weights = self.eager(rows, output=output)
        probs = recorder.last
        if probs is None or weights is None or probs.shape != weights.shape:
            probs = weights.to(torch.float32)  # not a plain softmax: keep what it returned
        return out, weights, probs

    @property
    def nested(self) -> bool:
        """True when ``previous()`` is another attngeom override's handler."""
        return self._override.previous == IMPLEMENTATION_NAME and self._override.below is not None

    @property
    def previous_is_eager(self) -> bool:
        """True when ``previous()`` is (or falls back to) the family's eager function."""
        prev = self._override.previous
        if prev == IMPLEMENTATION_NAME:
            return self._override.below is None  # set by hand, no handler below: eager
        return not (prev == "sdpa" and self.kwargs.get("softcap") is None)

    def previous(self) -> AttentionOutput:
        """The output of the implementation the model had before this override.

        sdpa is called with the mask it built itself; a nested attngeom override
        hands the call to the enclosing handler; eager, and anything that cannot
        reproduce the model here (flash or flex with a materialised mask, sdpa
        with softcapping), runs the family's eager function.
        """
        prev = self._override.previous
        if prev == IMPLEMENTATION_NAME and self._override.below is not None:
            below = self._override.below
            call = AttentionCall(
                self.module,
                self.layer,
                self.query,
                self.key,
                self.value,
                self.attention_mask,
                self.kwargs,
                below,
            )
            return below.handler(call)
        if not self.previous_is_eager:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            function = ALL_ATTENTION_FUNCTIONS["sdpa"]
            return function(
                self.module, self.query, self.key, self.value, self.attention_mask, **self.kwargs
            )
        return self.eager()


_SOFTMAXES = {torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax,
              torch.special.softmax}


class SoftmaxRecorder(torch.overrides.TorchFunctionMode):
    """While open, records the float32 softmax of every softmax call's input.

    A scoped torch-function mode, not a patch: the calls themselves run unchanged
    (their results are returned as computed), and the recording is a second softmax
    of the same input in float32. ``last`` is the latest recorded tensor.
    """

    def __init__(self) -> None:
        super().__init__()
        self.last: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _SOFTMAXES and args and isinstance(args[0], torch.Tensor):
            dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            self.last = torch.softmax(args[0].to(torch.float32), dim=dim)
        return out


def _attention_function(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> AttentionOutput:
    """The function registered in ``AttentionInterface``: hands the call to the active handler."""
    stack = _BY_MODULE.get(id(module))
    if not stack:
        raise ModelError(
            f"{type(module).__name__}: attention implementation {IMPLEMENTATION_NAME!r} "
            "called outside attngeom.capture.override_attention; set the model back "
            "to 'sdpa' or 'eager'"
        )
    for active in stack:  # every enclosing override of this model was reached too
        active.calls += 1
    override = stack[-1]
    call = AttentionCall(
        module, override.layers[id(module)], query, key, value, attention_mask, kwargs, override
    )
    return override.handler(call)


def _mask_function(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The function registered in ``AttentionMaskInterface`` under the same name.

    Builds the mask the model's previous implementation would have built (so its
    output is reproduced exactly); for implementations whose mask is not a
    dense tensor, a materialised boolean mask.
    """
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    config = kwargs.get("config")
    stack = _BY_CONFIG.get(id(config)) if config is not None else None
    base = stack[-1].base if stack else None
    if base in _DELEGATED_MASKS:
        return ALL_MASK_ATTENTION_FUNCTIONS[base](*args, **kwargs)
    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register_attention_interface() -> str:
    """Register the dispatcher and its mask function under one name (idempotent)."""
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(IMPLEMENTATION_NAME, _attention_function)
        AttentionMaskInterface.register(IMPLEMENTATION_NAME, _mask_function)
        _REGISTERED = True
    return IMPLEMENTATION_NAME


def _set_implementation(model: torch.nn.Module, name: str) -> None:
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise ModelError(
            f"{model_class_name(model)} does not let transformers switch its attention "
            f"implementation (asked for {name!r}, still "
            f"{model.config._attn_implementation!r}); expected a model whose attention "
            "goes through transformers' AttentionInterface"
        )


@contextlib.contextmanager
def override_attention(model: torch.nn.Module, handler: Handler) -> Iterator[None]:
    """Route every attention call of ``model`` to ``handler`` inside the context.

    ``handler(call: AttentionCall) -> (output (B, Q, H, d), weights or None)``
    replaces the attention function. On exit the model's previous attention
    implementation is restored, so its outputs are bit-identical to before
    (STYLE habit 6). Overrides nest: an inner handler's ``call.previous()`` is
    the enclosing handler. A forward in which no layer reached the handler
    raises ``ModelError`` naming the model class (its attention bypasses the
    interface).

    >>> layers = []
    >>> def handler(call):
    ...     layers.append(call.layer)
    ...     return call.previous()
    >>> with override_attention(model, handler):
    ...     _ = model(input_ids)
    >>> layers
    [0, 1, 2, 3, 4]
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise ModelError(
            f"{model_class_name(model)}: expected a transformers PreTrainedModel, got "
            "a plain module"
        )
    modules = attention_modules(model)
    for m in modules:
        family_eager_function(m)
    name = register_attention_interface()
    # transformers 5.x has no public getter for the active implementation;
    # ``config._attn_implementation`` is what ``set_attn_implementation`` writes
    # and what every attention module reads, so it is the one source of truth.
    previous = model.config._attn_implementation
    config_stack = _BY_CONFIG.setdefault(id(model.config), [])
    below = config_stack[-1] if previous == name and config_stack else None
    base = below.base if below is not None else previous
    override = _Override(
        handler=handler,
        layers={id(m): i for i, m in enumerate(modules)},
        previous=previous,
        base=base,
        below=below,
    )

    def after_forward(*_: Any) -> None:
        if override.calls == 0:
            raise ModelError(
                f"{model_class_name(model)}: no attention layer called the registered "
                "attention function; expected a model whose attention goes through "
                "transformers' AttentionInterface"
            )
        override.calls = 0

    def before_forward(*_: Any) -> None:
        override.calls = 0

    pushed: list[int] = []
    hooks = []
    try:
        for m in modules:
            _BY_MODULE.setdefault(id(m), []).append(override)
            pushed.append(id(m))
        config_stack.append(override)
        if previous != name:
            _set_implementation(model, name)
        hooks.append(model.register_forward_pre_hook(before_forward))
        hooks.append(model.register_forward_hook(after_forward))
        yield
    finally:
        for hook in hooks:
            hook.remove()
        if previous != name and model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)
        _pop(override, model.config, config_stack, pushed)


def _pop(override: _Override, config, config_stack: list, pushed: list[int]) -> None:
    """Take ``override`` off the model's and its modules' stacks (and the emptied stacks
    out of the registries), leaving any other override where it was."""
    if config_stack and config_stack[-1] is override:
        config_stack.pop()
    if not config_stack:
        _BY_CONFIG.pop(id(config), None)
    for key in pushed:
        stack = _BY_MODULE.get(key, [])
        if stack and stack[-1] is override:
            stack.pop()
        if not stack:
            _BY_MODULE.pop(key, None)


def has_override(model: torch.nn.Module) -> bool:
    """Whether an attngeom override (capture, restriction) is open on ``model``."""
    config = getattr(model, "config", None)
    return bool(_BY_CONFIG.get(id(config))) if config is not None else False


def repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, G, T, d) -> (B, G * groups, T, d): kv head g serves query heads g*groups..

    The GQA layout of docs/method.md §1: query head h reads kv head h // groups.
    """
    if groups == 1:
        return states
    b, g, t, d = states.shape
    return states[:, :, None].expand(b, g, groups, t, d).reshape(b, g * groups, t, d)
