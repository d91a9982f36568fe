"""attngeom.capture: the only code that knows transformers (STYLE layout).

Loading (``load_model``), the attention layout (``model_layout``), the
registered attention + mask function (``override_attention``), capture of
probabilities and value states (``capture_attention``, method §2 and 8), the head
output projections interventions hook into (``attention_output_projections``,
method §9) and the load-time self-checks (``check_model``). transformers itself is
imported only when one of these is called.
"""

from attngeom.capture.capture import LayerCapture, capture_attention
from attngeom.capture.checks import CheckReport, check_model
from attngeom.capture.interface import (
    IMPLEMENTATION_NAME,
    AttentionCall,
    has_override,
    override_attention,
    repeat_kv,
)
from attngeom.capture.layout import (
    Layout,
    attention_output_projections,
    head_weights,
    input_device,
    model_layout,
)
from attngeom.capture.loading import (
    cache_dir,
    check_device,
    load_model,
    load_tokenizer,
    model_shape,
    resolve_source,
)
from attngeom.capture.tolerances import TOLERANCES, Tolerance, tolerance_for

__all__ = [
    "IMPLEMENTATION_NAME",
    "TOLERANCES",
    "AttentionCall",
    "CheckReport",
    "LayerCapture",
    "Layout",
    "Tolerance",
    "attention_output_projections",
    "cache_dir",
    "check_device",
    "capture_attention",
    "check_model",
    "has_override",
    "head_weights",
    "input_device",
    "load_model",
    "load_tokenizer",
    "model_layout",
    "model_shape",
    "override_attention",
    "repeat_kv",
    "resolve_source",
    "tolerance_for",
]
