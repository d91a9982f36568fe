"""One dtype-keyed table of equivalence tolerances (STYLE habit 9).

Every comparison between two ways of computing the same attention quantity
(capture versus the model's own forward, sliced query rows versus the full eager
rows, probabilities summing to one) reads its tolerance here, so that a change
of precision policy is made in one place. The numbers are a few units of the
dtype's resolution at the magnitudes tiny and small real models produce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngeom.errors import ConfigError


@dataclass(frozen=True)
class Tolerance:
    """``torch.testing.assert_close``-style absolute and relative tolerances."""

    atol: float
    rtol: float

    def close(self, actual: torch.Tensor, expected: torch.Tensor) -> bool:
        """True when ``|actual - expected| <= atol + rtol * |expected|`` everywhere."""
        return bool(torch.allclose(actual, expected, atol=self.atol, rtol=self.rtol))


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-10, rtol=1e-9),
    torch.float32: Tolerance(atol=2e-5, rtol=1e-4),
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=3e-2),
}


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The tolerance for comparing tensors computed in ``dtype``."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        raise ConfigError(
            f"expected a dtype in {sorted(str(d) for d in TOLERANCES)}, got {dtype}"
        ) from None
