"""Head gates: scale or remove each attention head's contribution (method §9).

method §9 removes a head by zeroing its slice of the input to the attention output
projection (o_proj / c_proj / dense / out_proj by architecture): that input is the
concatenation of the heads' outputs, so slice ``h`` (features ``h*d .. (h+1)*d``)
is exactly head ``h``'s contribution and nothing else. A gate generalises this:
the slice is multiplied by ``gates[layer, head]`` (0 removes, 1 keeps).

The gates are forward pre-hooks on the modules that
:func:`attngeom.capture.attention_output_projections` names, so they work under
any attention implementation (eager, sdpa, flash) and never touch the weights.
Like every instrument here (STYLE habit 6) they are scoped: leaving the context
removes the hooks, even on an exception, and the model is bit-identical.

Shapes: ``gates`` (L, H); the projection input (..., H * d).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from attngeom.capture import attention_output_projections, input_device, model_layout
from attngeom.errors import ConfigError, ModelError, SelfCheckError

__all__ = ["check_gates", "gates_for_heads", "head_gates", "remove_heads", "window_gates"]


def _make_hook(
    gates: Tensor, layer: int, num_heads: int, head_dim: int, differentiable: bool
) -> Callable[..., Any]:
    """Pre-hook scaling each head's slice of layer ``layer``'s projection input.

    ``gates`` is (L, H), or (B, L, H) with one set of gates per window of the batch
    (the gradient ranker's per-window importances). The gate row is read at call
    time, so callers may edit ``gates`` in place inside the context (the
    single-head scans do) without reinstalling hooks.
    """
    width = num_heads * head_dim

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if args:
            x = args[0]
        elif len(kwargs) == 1:
            x = next(iter(kwargs.values()))
        else:
            raise ModelError(
                f"head_gates: cannot find the input of {type(module).__name__} in layer {layer}"
            )
        if not isinstance(x, Tensor) or x.shape[-1] != width:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ModelError(
                f"head_gates: expected the input of {type(module).__name__} in layer {layer} "
                f"to end in num_heads * head_dim = {width}, got {shape}"
            )
        row = gates[:, layer] if gates.dim() == 3 else gates[layer]
        if not differentiable:
            row = row.detach()
            # Gates of exactly one leave the input untouched (bit for bit, no copy).
            if bool((row == 1).all()):
                return None
        g = row.to(device=x.device, dtype=x.dtype)
        if gates.dim() == 3:
            if x.dim() < 2 or x.shape[0] != g.shape[0]:
                raise ModelError(
                    f"head_gates: expected a batch of {g.shape[0]} windows at "
                    f"{type(module).__name__} in layer {layer}, got {tuple(x.shape)}"
                )
            g = g.view(g.shape[0], *([1] * (x.dim() - 2)), num_heads)
        y = (x.unflatten(-1, (num_heads, head_dim)) * g[..., None]).flatten(-2)
        if args:
            return (y, *args[1:]), kwargs
        return args, {next(iter(kwargs)): y}

    return hook


@contextmanager
def _installed(model: nn.Module, gates: Tensor, differentiable: bool) -> Iterator[Tensor]:
    """Register the gate hooks on every layer's output projection; remove them on exit."""
    layout = model_layout(model)
    projections = attention_output_projections(model)
    if len(projections) != layout.num_layers:
        raise ModelError(
            f"head_gates: expected {layout.num_layers} output projections for "
            f"{layout.model_class}, got {len(projections)}"
        )
    handles = []
    try:
        for layer, module in enumerate(projections):
            hook = _make_hook(gates, layer, layout.num_heads, layout.head_dim, differentiable)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        yield gates
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def window_gates(model: nn.Module, num_windows: int) -> Iterator[Tensor]:
    """Differentiable gates of one, one set per window of a batch: (B, L, H) leaf.

    Inside, every forward call must have batch size ``num_windows``; the gradient
    of a sum of per-window losses then gives each window's own dL/d gate in one
    backward pass (Michel et al. 2019 average |dL(x)/d gate| over windows x).
    """
    layout = model_layout(model)
    gates = torch.ones(num_windows, layout.num_layers, layout.num_heads, requires_grad=True)
    with _installed(model, gates, differentiable=True) as g:
        yield g


@contextmanager
def head_gates(
    model: nn.Module, gates: Tensor | None = None, *, differentiable: bool = False
) -> Iterator[Tensor]:
    """Scale each head's output by a gate while the context is open (method §9).

    Args:
        model: any model :func:`attngeom.capture.attention_output_projections` supports.
        gates: (L, H) float gates, ``gates[l, h]`` multiplying head h of layer l;
            ``None`` means all ones (edit the yielded tensor in place to gate heads).
        differentiable: let gradients flow into the gates. The yielded tensor is
            then a float32 leaf with ``requires_grad`` (a detached copy of
            ``gates`` unless ``gates`` already is such a leaf), so
            ``torch.autograd.grad(loss, gates)`` gives dL/d gate, the head
            importance of Michel et al. 2019.

    Yields:
        The (L, H) gate tensor the hooks read at every forward call.

    A gate of 0 removes exactly that head's contribution; gates of 1 change
    nothing, bit for bit; on exit the hooks are removed, even on an exception.

    Example:
        >>> with head_gates(model) as g:
        ...     g[0, 3] = 0.0  # remove layer 0 head 3
        ...     logits = model(ids).logits
        >>> bool((logits != model(ids).logits).any())
        True
    """
    layout = model_layout(model)
    shape = (layout.num_layers, layout.num_heads)
    if gates is None:
        gates = torch.ones(shape, dtype=torch.float32)
    elif not isinstance(gates, Tensor):
        raise ConfigError(f"gates: expected a tensor of shape {shape}, got {type(gates).__name__}")
    if tuple(gates.shape) != shape:
        raise ConfigError(f"gates: expected shape (L, H) = {shape}, got {tuple(gates.shape)}")
    if not gates.is_floating_point():
        raise ConfigError(f"gates: expected a floating-point tensor, got {gates.dtype}")
    if differentiable and not (gates.is_leaf and gates.requires_grad):
        gates = gates.detach().to(torch.float32).clone().requires_grad_(True)
    with _installed(model, gates, differentiable) as g:
        yield g


def gates_for_heads(model: nn.Module, heads: Iterable[tuple[int, int]]) -> Tensor:
    """(L, H) float32 gates of one with a zero at every ``(layer, head)`` in ``heads``.

    Raises ConfigError (one line) for a layer or head out of range.
    """
    layout = model_layout(model)
    gates = torch.ones(layout.num_layers, layout.num_heads, dtype=torch.float32)
    for item in heads:
        try:
            layer, head = (int(v) for v in item)
        except (TypeError, ValueError):
            raise ConfigError(f"heads: expected (layer, head) pairs, got {item!r}") from None
        if not (0 <= layer < layout.num_layers and 0 <= head < layout.num_heads):
            raise ConfigError(
                f"heads: expected layer in [0, {layout.num_layers}) and head in "
                f"[0, {layout.num_heads}) for {layout.model_class}, got ({layer}, {head})"
            )
        gates[layer, head] = 0.0
    return gates


@contextmanager
def remove_heads(model: nn.Module, heads: Iterable[tuple[int, int]]) -> Iterator[Tensor]:
    """Remove the listed ``(layer, head)`` pairs while the context is open (method §9).

    Shorthand for :func:`head_gates` with zeros at ``heads``; yields the gates.

    Example:
        >>> with torch.no_grad(), remove_heads(model, [(0, 3)]):
        ...     loss = model(ids, labels=ids).loss
        >>> float(loss) > float(model(ids, labels=ids).loss.detach())
        True
    """
    gates = gates_for_heads(model, heads)
    with head_gates(model, gates) as g:
        yield g


def _output_tensor(out: Any) -> Tensor:
    """The main output of a forward call: logits, else the last hidden state."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, Tensor):
            return value
    if isinstance(out, Tensor):
        return out
    return out[0]


def check_gates(model: nn.Module, input_ids: Tensor | None = None) -> dict[str, float]:
    """Self-check (STYLE habit 7): gates of one change nothing, a zero gate changes the output.

    Runs the model on ``input_ids`` (default: 8 fixed token ids) plainly, with gates
    of one (must be bit-identical), with head (0, 0) and with the last head of the
    last layer removed (each must change the output), and plainly again after the
    gates are gone (must be bit-identical to the first run).

    Returns the largest absolute output difference of each run against the plain one:
    ``gates_of_one`` and ``restored`` (both 0), ``removed L:H`` (each > 0).

    Raises:
        SelfCheckError: naming the model class and the check that failed.
    """
    layout = model_layout(model)
    name = layout.model_class
    device = input_device(model)
    if input_ids is None:
        emb = model.get_input_embeddings()
        vocab = int(getattr(emb, "num_embeddings", 0) or emb.weight.shape[0])
        length = max(2, min(8, int(layout.max_positions or 8)))
        input_ids = (torch.arange(length) * 7 + 3).remainder(vocab)[None]
    input_ids = input_ids.to(device)

    def forward() -> Tensor:
        with torch.no_grad():
            return _output_tensor(model(input_ids=input_ids)).detach().clone()

    def deviation(a: Tensor, b: Tensor) -> float:
        return float((a.float() - b.float()).abs().max())

    plain = forward()
    with head_gates(model):
        ones = forward()
    if not torch.equal(plain, ones):
        raise SelfCheckError(f"{name}: head gates of one changed the output")
    report = {"gates_of_one": deviation(plain, ones)}
    last = (layout.num_layers - 1, layout.num_heads - 1)
    for head in sorted({(0, 0), last}):
        with remove_heads(model, [head]):
            removed = forward()
        if torch.equal(plain, removed):
            raise SelfCheckError(
                f"{name}: removing layer {head[0]} head {head[1]} did not change the output"
            )
        report[f"removed {head[0]}:{head[1]}"] = deviation(plain, removed)
    again = forward()
    if not torch.equal(plain, again):
        raise SelfCheckError(f"{name}: the output changed after the head gates were removed")
    report["restored"] = deviation(plain, again)
    return report
