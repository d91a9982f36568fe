"""RestrictConfig: rankings, renormalize both, taus in (0, 1), search, localised scope."""

from __future__ import annotations

import pytest

from attngeom.config import RestrictConfig
from attngeom.errors import ConfigError

BASE = dict(model="m", corpus="c")


def test_defaults_and_both():
    cfg = RestrictConfig(**BASE)
    assert cfg.rankings == ("attention",) and cfg.search == "adaptive"
    assert cfg.renormalize == (True, False) and cfg.scope == "model"
    assert RestrictConfig(**BASE, renormalize="both").renormalize == (False, True)
    assert RestrictConfig(**BASE, renormalize=["both"]).renormalize == (False, True)
    assert RestrictConfig(**BASE, renormalize="false").renormalize == (False,)
    cfg = RestrictConfig(**BASE, rankings="contribution,random,attention")
    assert cfg.rankings == ("contribution", "random", "attention")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rankings": "gradient"}, "rankings: unknown restriction ranking .gradient. "
                                   ".known: attention, contribution, random"),
        ({"taus": "5"}, r"taus: expected relative thresholds in \(0, 1\)"),
        ({"taus": "0"}, r"taus: expected relative thresholds in \(0, 1\)"),
        ({"taus": "0.05,1"}, r"in \(0, 1\).*got 1"),
        ({"search": "exhaustive"}, "search: expected one of adaptive, grid"),
        ({"scope": "layers"}, "scope: expected one of model, layer, head"),
        ({"scope": "head", "scan_top_layers": 0}, "no layer to scan"),
        ({"scope": "layer", "scan_n": "128"}, "scan_n: expected N below the window length"),
        ({"renormalize": "maybe"}, "renormalize: expected true or false"),
        ({"bootstrap": -1}, "bootstrap"),
    ],
)
def test_bad_values_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        RestrictConfig(**BASE, **kwargs)
    assert "\n" not in str(err.value)
