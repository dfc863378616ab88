"""The demo's cached index (and the tests' Qwen tokenizer) is keyed on content: a copy in a moved checkout, whose
virtual environment sits elsewhere, is reused as it is; a changed input rebuilds it, with one line saying which."""

import json
import shutil
from pathlib import Path

import pytest

from local_dense_retriever.building import fingerprints
from local_dense_retriever.building import index as index_builder
from local_dense_retriever.demo import embedded_default, mini_wiki
from support import qwen_tokenizer

SUMMARIES = 24  # a tiny corpus: the same code path as the 10,033 summaries, built in seconds


def moved_model(folder: Path) -> Path:
    """The MiniLM folder as another virtual environment holds it: the same files under another absolute path."""
    source = mini_wiki.minilm_model_dir()
    for path in source.rglob("*"):
        if path.is_file():
            (folder / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (folder / path.relative_to(source)).symlink_to(path)
    return folder


def no_build(*_args, **_kwargs):
    raise AssertionError("the index was built again")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A cache built once, in what stands for the first checkout."""
    summaries = mini_wiki.load_summaries()[:SUMMARIES]
    cache = tmp_path_factory.mktemp("checkout") / ".cache" / "mini_wiki"
    assert embedded_default.prepare(cache, progress=False, summaries=summaries).build_seconds is not None
    return cache, summaries


def test_a_copied_cache_is_reused_where_the_environment_moved(built, tmp_path, monkeypatch, capsys):
    cache, summaries = built
    copied = tmp_path / "moved_checkout" / ".cache" / "mini_wiki"
    shutil.copytree(cache, copied)
    moved = moved_model(tmp_path / "moved_checkout" / ".venv" / "site-packages" / "model")
    monkeypatch.setattr(mini_wiki, "minilm_model_dir", lambda: moved)
    monkeypatch.setattr(index_builder, "build", no_build)
    capsys.readouterr()

    assets = embedded_default.prepare(copied, progress=False, summaries=json.loads(json.dumps(summaries)))
    assert assets.build_seconds is None
    assert assets.index_path == copied / "minilm_Flat.index"
    assert capsys.readouterr().err == ""  # nothing rebuilt, nothing to explain
    assert str(tmp_path) not in (copied / "manifest.json").read_text()  # and no path was written into the key
    assert str(cache.parent) not in (copied / "manifest.json").read_text()


def edited_summary(summaries: list[dict]) -> list[dict]:
    changed = json.loads(json.dumps(summaries))
    changed[3]["extract"] += " One more sentence."  # 19 bytes
    return changed


def edited_encoder(tmp_path: Path) -> Path:
    folder = moved_model(tmp_path / "model")
    (folder / "data_config.json").unlink()
    (folder / "data_config.json").write_text("{}")
    return folder


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("passages", "passages bytes changed (12025 -> 12044)"),
        ("encoder", "encoder data_config.json bytes changed (39265 -> 2)"),
        ("versions", "versions transformers changed ("),
    ],
)
def test_a_changed_input_rebuilds_the_index_and_says_which(built, tmp_path, monkeypatch, capsys, change, reason):
    cache, summaries = built
    copied = tmp_path / ".cache" / "mini_wiki"
    shutil.copytree(cache, copied)
    if change == "passages":
        summaries = edited_summary(summaries)
    elif change == "encoder":
        folder = edited_encoder(tmp_path)
        monkeypatch.setattr(mini_wiki, "minilm_model_dir", lambda: folder)
    else:
        installed = fingerprints.package_versions()
        monkeypatch.setattr(fingerprints, "package_versions", lambda: {**installed, "transformers": "0.0.1"})
    builds = []
    monkeypatch.setattr(index_builder, "build", lambda config: builds.append(config) or no_build())
    capsys.readouterr()

    with pytest.raises(AssertionError, match="built again"):
        embedded_default.prepare(copied, progress=False, summaries=summaries)
    assert len(builds) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"building the index in {copied}: {reason}")


def test_only_the_files_are_rewritten_when_only_a_page_changed(built, tmp_path, monkeypatch, capsys):
    """A description (on the pages, not in the passages) changes the files, not the vectors: no encoding."""
    cache, summaries = built
    copied = tmp_path / ".cache" / "mini_wiki"
    shutil.copytree(cache, copied)
    changed = json.loads(json.dumps(summaries))
    changed[0]["description"] = "a description the encoder never sees"
    monkeypatch.setattr(index_builder, "build", no_build)
    capsys.readouterr()

    assert embedded_default.prepare(copied, progress=False, summaries=changed).build_seconds is None
    assert capsys.readouterr().err.startswith(f"rewriting the corpus and pages in {copied}: summaries bytes")
    assert "a description the encoder never sees" in (copied / "mini_wiki_pages.jsonl").read_text()
    assert embedded_default.prepare(copied, progress=False, summaries=changed).build_seconds is None
    assert capsys.readouterr().err == ""  # and the manifest now says so


def test_the_tokenizer_cache_is_keyed_on_its_content_too(tokenizer_dir, tmp_path, monkeypatch, capsys):
    copied = tmp_path / "qwen2.5-tokenizer"
    shutil.copytree(tokenizer_dir, copied)
    rebuilt = []
    monkeypatch.setattr(qwen_tokenizer, "build_qwen25_tokenizer", rebuilt.append)
    capsys.readouterr()
    assert qwen_tokenizer.qwen25_tokenizer_dir(copied) == copied
    assert rebuilt == [] and capsys.readouterr().err == ""

    installed = fingerprints.package_versions(("transformers", "tokenizers"))
    monkeypatch.setattr(qwen_tokenizer, "package_versions", lambda names: {**installed, "tokenizers": "0.0.1"})
    qwen_tokenizer.qwen25_tokenizer_dir(copied)
    assert rebuilt == [copied]
    assert capsys.readouterr().err == (
        f"building the Qwen2.5 tokenizer in {copied}: versions tokenizers changed ({installed['tokenizers']} -> "
        "0.0.1)\n"
    )
