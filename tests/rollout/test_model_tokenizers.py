"""The checkpoints' tokenizers the suite rebuilds offline are the real ones: their recorded sources, known encodings,
added-token flags, end tokens and official chat templates (tests/support/model_tokenizers.py)."""

import hashlib
import json
import re
from pathlib import Path

import pytest

from support import model_tokenizers
from support.model_tokenizers import CHECKPOINTS, checkpoint_dir, load_checkpoint_tokenizer

SOURCES = model_tokenizers.TEMPLATES_DIR / "SOURCES.md"
TABLE_ROW = re.compile(r"^\| (?P<first>[^|]+?) \|.*\| (?P<sha256>[0-9a-f]{64}) \|$", re.MULTILINE)

QUESTION = "Who painted the Mona Lisa"
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search Wikipedia.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
TOOL_CONVERSATION = [
    {"role": "system", "content": "Answer the question."},
    {"role": "user", "content": QUESTION + "?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": QUESTION}}}],
    },
    {"role": "tool", "content": "Leonardo da Vinci"},
]

# What each checkpoint's own files say, from public sources (see templates/SOURCES.md):
# encodings: text -> ids without bos; ids quoted by the checkpoints' model cards and the vocabularies' own tests.
# single: tags that are one added token, not special (kept by skip_special_tokens, as in the real tokenizer).
# eos: tokenizer_config.json's eos_token id; stop_ids: generation_config.json's eos_token_id list.
# call / result: how the template writes the assistant's tool call and frames the tool's reply.
# prompt_end: the generation prompt's ending, thinking on (the template's default) and off.
QWEN3_TAGS = {"<tool_call>": 151657, "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666}
QWEN3_THINK_TAGS = {"<think>": 151667, "</think>": 151668}
QWEN3_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Who painted the Mona Lisa"}}\n</tool_call>'
QWEN3_RESULT = "<|im_start|>user\n<tool_response>\nLeonardo da Vinci\n</tool_response><|im_end|>\n"
EXPECTED = {
    "qwen3-4b": {
        "encodings": {"Hello world": [9707, 1879]},
        "single": {**QWEN3_TAGS, **QWEN3_THINK_TAGS},
        "eos": ("<|im_end|>", 151645),
        "stop_ids": [151645, 151643],
        "call": QWEN3_CALL,
        "result": QWEN3_RESULT,
        "prompt_end": ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    },
    "qwen3-4b-instruct-2507": {
        "encodings": {"Hello world": [9707, 1879]},
        "single": {**QWEN3_TAGS, **QWEN3_THINK_TAGS},
        "eos": ("<|im_end|>", 151645),
        "stop_ids": [151645, 151643],
        "call": QWEN3_CALL,
        "result": QWEN3_RESULT,
        "prompt_end": ("<|im_start|>assistant\n", "<|im_start|>assistant\n"),
    },
    "qwen3-4b-thinking-2507": {
        "encodings": {"Hello world": [9707, 1879]},
        "single": {**QWEN3_TAGS, **QWEN3_THINK_TAGS},
        "eos": ("<|im_end|>", 151645),
        "stop_ids": [151645, 151643],
        "call": QWEN3_CALL,
        "result": QWEN3_RESULT,
        "prompt_end": ("<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n"),
    },
}


def sources_rows() -> dict[str, str]:
    return {m["first"]: m["sha256"] for m in TABLE_ROW.finditer(SOURCES.read_text())}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_committed_template_has_its_recorded_sha256():
    rows = sources_rows()
    templates = sorted(p.name for p in model_tokenizers.TEMPLATES_DIR.glob("*.jinja"))
    assert templates == sorted(name for name in rows if name.endswith(".jinja"))
    assert {name: sha256(model_tokenizers.TEMPLATES_DIR / name) for name in templates} == {
        name: rows[name] for name in templates
    }


def test_every_vocabulary_file_has_its_recorded_sha256():
    packages = {row: digest for row, digest in sources_rows().items() if "==" in row}
    assert packages
    for requirement, digest in packages.items():
        relative = next(
            line.split(" | ")[1] for line in SOURCES.read_text().splitlines() if line.startswith(f"| {requirement} |")
        )
        package, *parts = relative.split("/")
        assert sha256(model_tokenizers.installed_file(package, *parts)) == digest, relative


def test_each_checkpoint_names_its_template_and_qwen25_is_the_suites_own():
    assert {"qwen2.5-3b", *model_tokenizers.SPECS} <= set(CHECKPOINTS)
    assert checkpoint_dir("qwen2.5-3b") == model_tokenizers.qwen25_tokenizer_dir()
    with pytest.raises(ValueError, match="unknown checkpoint 'qwen4'; known: qwen2.5-3b, "):
        checkpoint_dir("qwen4")


@pytest.mark.parametrize("name", EXPECTED)
def test_known_encodings_and_single_token_tags(name):
    tokenizer, expected = load_checkpoint_tokenizer(name), EXPECTED[name]
    for text, ids in expected["encodings"].items():
        assert tokenizer.encode(text, add_special_tokens=False) == ids, text
    for tag, token_id in expected["single"].items():
        assert tokenizer.encode(tag, add_special_tokens=False) == [token_id], tag
        assert tokenizer.decode([token_id], skip_special_tokens=True) == tag  # added, not special
    assert len(tokenizer.encode(expected["call"], add_special_tokens=False)) > 2


@pytest.mark.parametrize("name", EXPECTED)
def test_end_tokens_as_the_checkpoint_declares_them(name):
    tokenizer, expected = load_checkpoint_tokenizer(name), EXPECTED[name]
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == expected["eos"]
    generation_config = json.loads((checkpoint_dir(name) / "generation_config.json").read_text())
    assert generation_config["eos_token_id"] == expected["stop_ids"]
    assert tokenizer.decode(expected["stop_ids"], skip_special_tokens=True) == ""  # special: skipped on decode


@pytest.mark.parametrize("name", EXPECTED)
def test_the_official_template_renders_a_tool_call_its_reply_and_the_generation_prompt(name):
    tokenizer, expected = load_checkpoint_tokenizer(name), EXPECTED[name]
    rendered = tokenizer.apply_chat_template(
        TOOL_CONVERSATION, tools=[SEARCH_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert (
        tokenizer.chat_template == (model_tokenizers.TEMPLATES_DIR / model_tokenizers.SPECS[name].template).read_text()
    )
    assert expected["call"] in rendered
    assert expected["result"] in rendered
    thinking_on, thinking_off = expected["prompt_end"]
    assert rendered.endswith(thinking_on)
    quiet = tokenizer.apply_chat_template(
        TOOL_CONVERSATION, tools=[SEARCH_TOOL], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert quiet.endswith(thinking_off)
    ids = tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=[SEARCH_TOOL], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tokenizer.decode(ids) == rendered  # the rendered prompt round-trips through the real vocabulary
