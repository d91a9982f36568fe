"""``attngeom check``: the load-time self-checks, with what each one measured.

Every check is reported with its largest deviation and the bound it was held to, so
a user sees how close their model came, not only that it passed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckLine:
    """One check: what it checks, the largest deviation measured, and the bound."""

    name: str
    measured: float
    bound: str

    def __str__(self) -> str:
        return f"  {self.name:<52} {self.measured:>11.3g}   {self.bound}"


@dataclass(frozen=True)
class CheckResult:
    model: str
    model_class: str
    lines: tuple[CheckLine, ...]

    def __str__(self) -> str:
        head = f"  {'check':<52} {'largest dev.':>11}   bound"
        body = "\n".join(str(line) for line in self.lines)
        return (f"self-checks passed: {self.model} ({self.model_class})\n{head}\n{body}")


def run_checks(model: str | None = None, *, device: str = "cpu",
               dtype: str = "float32", quantization: str = "none") -> CheckResult:
    """Load ``model`` (default: the bundled stories260K) and run every self-check."""
    from attngeom import validate as v
    from attngeom.assets import DEFAULT_MODEL, asset
    from attngeom.capture import check_model, load_model
    from attngeom.interventions.gates import check_gates
    from attngeom.names import QUANTIZATIONS

    v.one_of("quantization", quantization, QUANTIZATIONS)  # before any weights are read
    name = model or asset(DEFAULT_MODEL, "--model")
    m, tok = load_model(name, device=device, dtype=dtype, quantization=quantization)
    rep = check_model(m, tok)
    gates = check_gates(m)
    tol = rep.tolerance
    lines = [
        CheckLine(f"layers captured ({rep.layers_captured} of {rep.num_layers})",
                  float(rep.num_layers - rep.layers_captured), "0 missing"),
        CheckLine("output under capture vs own forward (max |diff|)", rep.max_output_error,
                  f"atol {tol.atol:g} + rtol {tol.rtol:g}"),
        CheckLine("visible probabilities sum to 1 (max |sum - 1|)", rep.max_sum_error,
                  f"<= {tol.atol * 10 + tol.rtol:.3g}"),
        CheckLine("masked keys get probability 0 (max)", rep.max_masked_probability, "= 0"),
        CheckLine("head gates of one (max |diff|)", gates["gates_of_one"], "= 0 (bit-identical)"),
    ]
    lines += [CheckLine(f"removing head {k.split(' ')[1]} changes the output (max |diff|)",
                        v, "> 0") for k, v in gates.items() if k.startswith("removed")]
    lines.append(CheckLine("output after the gates are removed (max |diff|)", gates["restored"],
                           "= 0 (bit-identical)"))
    return CheckResult(model=name, model_class=rep.model_class, lines=tuple(lines))
