"""Qwen2.5's real tokenizer, rebuilt offline from the BPE ranks that the `dashscope` wheel ships.

The hub is unreachable here, so the tests cannot download Qwen/Qwen2.5-3B's tokenizer.json. The
151,643 byte-level BPE ranks are the same file Qwen2/Qwen2.5 use; transformers' TikTokenConverter
turns them into a fast tokenizer, and we add Qwen2.5's special tokens with their real ids plus the
ChatML chat template (with tool calls). The result is saved with `save_pretrained`, so the code
under test loads it exactly as slime does: `AutoTokenizer.from_pretrained(path)`.
"""

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from local_dense_retriever.building.fingerprints import file_digest, package_versions, stale_reason

# Qwen2's pre-tokenizer split: like cl100k but digits are split one by one.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (token, special) in id order from 151643; <tool_call> and the FIM tokens are ordinary added tokens in Qwen2.5.
QWEN25_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
FIRST_ADDED_ID = 151643

CHAT_TEMPLATE_PATH = Path(__file__).with_name("qwen2_5_chat_template.jinja")
CACHE_ROOT = Path(__file__).resolve().parents[2] / ".cache"
DEFAULT_CACHE_DIR = CACHE_ROOT / "qwen2.5-tokenizer"
MANIFEST = "manifest.json"


def qwen_tiktoken_file() -> Path:
    """The qwen.tiktoken ranks inside the installed (never imported) dashscope package."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or spec.origin is None:
        raise RuntimeError("the `dashscope` package is not installed; run `pip install --no-deps dashscope`")
    path = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the installed dashscope package")
    return path


def qwen_bpe_backend(added_tokens: list[tuple[str, bool]]):
    """The Qwen ranks as a `tokenizers.Tokenizer`, with `added_tokens` (token, special) at ids from 151643."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(qwen_tiktoken_file()), pattern=QWEN_SPLIT_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    backend.add_tokens([AddedToken(tok, special=special, normalized=False) for tok, special in added_tokens])
    for offset, (tok, _) in enumerate(added_tokens):
        if backend.token_to_id(tok) != FIRST_ADDED_ID + offset:
            raise RuntimeError(f"{tok} got id {backend.token_to_id(tok)}, expected {FIRST_ADDED_ID + offset}")
    return backend


def save_tokenizer(tokenizer, out_dir: Path, key: dict, extra_files: dict[str, dict] | None = None) -> Path:
    """`tokenizer.save_pretrained(out_dir)` plus the manifest `key` and `extra_files` (name -> JSON), swapped into
    place whole so a reader never sees half a directory."""
    tmp_dir = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    tokenizer.save_pretrained(tmp_dir)
    for name, content in (extra_files or {}).items():
        (tmp_dir / name).write_text(json.dumps(content, indent=2) + "\n")
    (tmp_dir / MANIFEST).write_text(json.dumps(key))
    old_dir = out_dir.with_name(out_dir.name + f".old{os.getpid()}")
    if out_dir.exists():
        os.replace(out_dir, old_dir)
    os.replace(tmp_dir, out_dir)
    shutil.rmtree(old_dir, ignore_errors=True)
    return out_dir


def cached_build(cache_dir: Path, key: dict, build: Callable[[Path], object], label: str) -> Path:
    """`cache_dir` as `build(cache_dir)` made it, built on first use and rebuilt, with one line saying why, when
    `key` (what the directory is made of) differs from the manifest saved beside it."""
    manifest = cache_dir / MANIFEST
    if not (cache_dir / "tokenizer.json").is_file():
        reason = "nothing is cached yet"
    else:
        earlier = json.loads(manifest.read_text()) if manifest.is_file() else {}
        reason = stale_reason(earlier, json.loads(json.dumps(key)))  # tuples compared as JSON lists
    if reason:
        print(f"building the {label} tokenizer in {cache_dir}: {reason}", file=sys.stderr, flush=True)
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        build(cache_dir)
    return cache_dir


def build_qwen25_tokenizer(out_dir: Path) -> Path:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=qwen_bpe_backend(QWEN25_ADDED_TOKENS),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[tok for tok, special in QWEN25_ADDED_TOKENS if special and tok != "<|endoftext|>"],
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE_PATH.read_text()
    return save_tokenizer(tokenizer, out_dir, tokenizer_key())


def tokenizer_key() -> dict:
    """What the saved tokenizer is made of, by content (no path: a moved cache stays valid)."""
    return {
        "ranks": file_digest(qwen_tiktoken_file()),
        "chat_template": file_digest(CHAT_TEMPLATE_PATH),
        "added_tokens": QWEN25_ADDED_TOKENS,
        "split_pattern": QWEN_SPLIT_PATTERN,
        "versions": package_versions(("transformers", "tokenizers")),
    }


def qwen25_tokenizer_dir(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Directory holding the saved tokenizer, built on first use (~20 s) and cached; rebuilt, with one line saying
    why, when what it is made of changed."""
    return cached_build(cache_dir, tokenizer_key(), build_qwen25_tokenizer, "Qwen2.5")
