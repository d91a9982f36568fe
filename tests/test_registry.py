"""The one registry shape (``attngeom.registry``) and the rule that every user-facing list
of names is read from a registry, never spelt out again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attngeom import names
from attngeom.errors import ConfigError
from attngeom.registry import Registry, UnknownName

SRC = Path(__file__).resolve().parents[1] / "src" / "attngeom"


def test_register_lookup_order_and_unregister() -> None:
    r = Registry("colour", option="colours", builtins=("red", ("green", {"hex": "0f0"})))
    assert r.names() == ("red", "green") and "red" in r and len(r) == 2
    assert r.meta("green") == {"hex": "0f0"} and r.meta("red") is None
    with pytest.raises(ConfigError, match="declared but nothing registers"):
        r["red"]  # declared, no module fills it in
    r.register("red", 1)

    @r.register("blue")
    def blue():
        return 3

    assert r["red"] == 1 and r["blue"] is blue and r.names() == ("red", "green", "blue")
    with pytest.raises(ConfigError, match="already registered"):
        r.register("blue", 4)
    r.register("blue", 4, replace=True)
    assert r.get("blue") == 4 and r.get("nope", None) is None
    r.unregister("blue")
    assert "blue" not in r and r.names() == ("red", "green")
    with pytest.raises(ConfigError, match="built-in colour 'red' cannot be unregistered"):
        r.unregister("red")
    with r.registered("teal", 5):
        assert r.choices("teal,red") == ("teal", "red")
    assert "teal" not in r


def test_unknown_names_are_one_did_you_mean_line() -> None:
    r = Registry("colour", option="colours", builtins=("red", "green"))
    with pytest.raises(UnknownName) as e:
        r.check("gren")
    assert str(e.value) == ("colours: unknown colour 'gren'; did you mean 'green'? "
                            "(known: red, green)")
    assert isinstance(e.value, KeyError) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^palette: unknown colour 'zzz' \(known: red, green\)$"):
        r.choices(["red", "zzz"], "palette")
    with pytest.raises(ConfigError, match="expected at least one of red, green"):
        r.choices("")


def test_builtins_resolve_lazily_from_their_module() -> None:
    """Every registry declared in names.py: each built-in resolves to a registered entry
    (importing the module that registers it), none is left declared but empty."""
    for name in dir(names):
        reg = getattr(names, name)
        if not isinstance(reg, Registry) or reg.module is None:
            continue
        for entry in reg.names():
            assert reg[entry] is not None, (name, entry)


def _registries() -> dict[str, set[str]]:
    from attngeom.config import COMMANDS

    out = {k: set(v.names()) for k, v in vars(names).items() if isinstance(v, Registry)}
    out["COMMANDS"] = set(COMMANDS.names())
    for k in ("DISTANCES", "VARIANTS", "REGIMES", "RESTRICT_SCOPES", "DTYPES",
              "QUANTIZATIONS", "DOC_BOUNDARIES"):
        out[k] = set(getattr(names, k))
    return out


# quoted data: the published references name settings as the papers wrote them
QUOTED = {"studies/references.py"}


def _spelt_lists(path: Path, registries: dict[str, set[str]]) -> list[str]:
    """Literal tuples, lists and sets of names of one registry: three or more of them, or
    all of a registry's names (a copy that would miss a name registered later). A line
    that says ``# subset of REGISTRY`` chooses some names on purpose and is left alone."""
    found = []
    lines = path.read_text().splitlines()
    for node in ast.walk(ast.parse(path.read_text())):
        if "# subset of " in lines[node.lineno - 1] if hasattr(node, "lineno") else False:
            continue
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or len(node.elts) < 2:
            continue
        if not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            continue
        values = {e.value for e in node.elts}
        for kind, known in registries.items():
            if values <= known and (len(values) >= 3 or values == known):
                found.append(f"line {node.lineno}: {kind} {sorted(values)}")
    return found


def test_no_user_facing_list_of_names_is_spelt_outside_its_registry() -> None:
    registries = _registries()
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "names.py" or rel in QUOTED:
            continue
        offenders += [f"{rel} {x}" for x in _spelt_lists(path, registries)]
    assert not offenders, "\n".join(offenders)


def test_the_scan_finds_a_copied_list(tmp_path) -> None:
    f = tmp_path / "copy.py"
    f.write_text('RANKS = ("attention", "contribution", "random")\nPAIR = ("layer", "head")\n')
    assert _spelt_lists(f, _registries()) and len(_spelt_lists(f, _registries())) >= 1
    assert all("RANKS" not in x for x in _spelt_lists(f, {"X": {"layer", "head", "model"}}))


def test_the_policies_declared_in_names_are_the_policies_registered() -> None:
    """names.RANKINGS declares each policy's fixed part and prefill-only flag for the
    configuration (no torch); they are the policy's own at its default parameters."""
    from attngeom.interventions.policies import POLICIES

    for name, policy in POLICIES.items():
        meta = names.RANKINGS.meta(name)
        defaults = {k: p.default for k, p in policy.params.items()}
        assert meta["kind"] == "policy" and names.RANKINGS[name] is policy
        assert meta["fixed"] == policy.fixed(defaults), name
        assert bool(meta.get("prefill_only")) == policy.prefill_only, name
    assert {n for n in names.RANKINGS if names.RANKINGS.meta(n)["kind"] == "policy"} == {
        *POLICIES, "positional"}


def test_every_study_table_name_is_declared_like_its_run_table():
    """A part's tables renamed in a study (``CommandSpec.study_tables``) have the run
    table's columns and row keys, so the study's combined tables validate."""
    from attngeom.config import COMMANDS
    from attngeom.results.schemas import ROW_KEYS, SCHEMAS, STUDY_NAMES

    renamed = {(study, run) for name in COMMANDS.names()
               for run, study in COMMANDS[name].study_tables}
    assert renamed and renamed <= set(STUDY_NAMES)
    for study, run in renamed:
        assert SCHEMAS[study] == SCHEMAS[run] and ROW_KEYS[study] == ROW_KEYS[run]
