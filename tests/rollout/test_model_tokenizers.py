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
# single: tag -> (id, special): one added token each; a special one is dropped by skip_special_tokens, an ordinary
# one kept, as in the real tokenizer.
# eos: tokenizer_config.json's eos_token id; stop_ids: generation_config.json's eos_token_id list.
# call / result: how the template writes the assistant's tool call and frames the tool's reply.
# prompt_end: the generation prompt's ending, thinking on (the template's default) and off.
QWEN3_TAGS = {
    "<|im_start|>": (151644, True),
    "<|im_end|>": (151645, True),
    "<tool_call>": (151657, False),
    "</tool_call>": (151658, False),
    "<tool_response>": (151665, False),
    "</tool_response>": (151666, False),
    "<think>": (151667, False),
    "</think>": (151668, False),
}
QWEN3_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Who painted the Mona Lisa"}}\n</tool_call>'
QWEN3_RESULT = "<|im_start|>user\n<tool_response>\nLeonardo da Vinci\n</tool_response><|im_end|>\n"
EXPECTED = {
    "qwen3-4b": {
        "encodings": {"Hello world": [9707, 1879]},
        "single": QWEN3_TAGS,
        "eos": ("<|im_end|>", 151645),
        "stop_ids": [151645, 151643],
        "call": QWEN3_CALL,
        "result": QWEN3_RESULT,
        "prompt_end": ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    },
    "qwen3-4b-instruct-2507": {
        "encodings": {"Hello world": [9707, 1879]},
        "single": QWEN3_TAGS,
        "eos": ("<|im_end|>", 151645),
        "stop_ids": [151645, 151643],
        "call": QWEN3_CALL,
        "result": QWEN3_RESULT,
        "prompt_end": ("<|im_start|>assistant\n", "<|im_start|>assistant\n"),
    },
    "qwen3-4b-thinking-2507": {
        "encodings": {"Hello world": [9707, 1879]},
        "single": QWEN3_TAGS,
        "eos": ("<|im_end|>", 151645),
        "stop_ids": [151645, 151643],
        "call": QWEN3_CALL,
        "result": QWEN3_RESULT,
        "prompt_end": ("<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n"),
    },
    "llama-3.2-3b-instruct": {
        # llama-models==0.3.0, llama_models/llama3/tests/api/test_tokenizer.py; "Hello world" from offline-assets.md.
        "encodings": {"This is a test sentence.": [2028, 374, 264, 1296, 11914, 13], "Hello world": [9906, 1917]},
        "single": {
            "<|begin_of_text|>": (128000, True),
            "<|start_header_id|>": (128006, True),
            "<|end_header_id|>": (128007, True),
            "<|eom_id|>": (128008, True),
            "<|eot_id|>": (128009, True),
            "<|python_tag|>": (128010, True),
            "<|reserved_special_token_247|>": (128255, True),
        },
        "eos": ("<|eot_id|>", 128009),
        "stop_ids": [128001, 128008, 128009],
        "call": '{"name": "search", "parameters": {"query": "Who painted the Mona Lisa"}}<|eot_id|>',
        "result": '<|start_header_id|>ipython<|end_header_id|>\n\n"Leonardo da Vinci"<|eot_id|>',
        "prompt_end": ("<|start_header_id|>assistant<|end_header_id|>\n\n",) * 2,
    },
    "qwen3.5-4b": {
        # Both split a letter from its combining mark under Qwen2's pattern, not under Qwen3.5's (public test vectors
        # of the real tokenizer.json; see templates/SOURCES.md).
        "encodings": {"Hello": [9419], "क्": [149567], "क्ष": [151858]},
        "single": {
            "<|im_start|>": (248045, True),
            "<|im_end|>": (248046, True),
            "<tool_call>": (248058, False),
            "</tool_call>": (248059, False),
            "<tool_response>": (248066, False),
            "</tool_response>": (248067, False),
            "<think>": (248068, False),
            "</think>": (248069, False),
            "<|audio_pad|>": (248076, True),
        },
        "eos": ("<|im_end|>", 248046),
        "stop_ids": [248046, 248044],
        "call": "<tool_call>\n<function=search>\n<parameter=query>\nWho painted the Mona Lisa\n</parameter>\n"
        "</function>\n</tool_call>",
        "result": "<|im_start|>user\n<tool_response>\nLeonardo da Vinci\n</tool_response><|im_end|>\n",
        "prompt_end": ("<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    },
}
# A fixed date for Llama 3.2's template, which otherwise writes today's date into the system header.
TEMPLATE_KWARGS = {"llama-3.2-3b-instruct": {"date_string": "26 Jul 2024"}}

# llama.cpp (github.com/ggml-org/llama.cpp, convert_hf_to_gguf.py, get_vocab_base_pre) names a vocabulary and
# pre-tokenizer by the sha256 of str(tokenizer.encode(CHKTXT)) with the real checkpoint's tokenizer.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
LLAMA_CPP_CHKHSH = {
    "qwen2.5-3b": "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",  # "qwen2", ref Qwen/Qwen1.5-7B
    "qwen3-4b": "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",
    "qwen3-4b-instruct-2507": "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",
    "qwen3-4b-thinking-2507": "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",
    # "llama-bpe", ref meta-llama/Meta-Llama-3-8B (the bos the tokenizer adds is part of the hash)
    "llama-3.2-3b-instruct": "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5",
    # "qwen35", ref Qwen/Qwen3.5-9B-Instruct
    "qwen3.5-4b": "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4",
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
    assert set(CHECKPOINTS) == {"qwen2.5-3b", *model_tokenizers.SPECS} == set(LLAMA_CPP_CHKHSH)
    assert checkpoint_dir("qwen2.5-3b") == model_tokenizers.qwen25_tokenizer_dir()
    with pytest.raises(ValueError, match="unknown checkpoint 'qwen4'; known: qwen2.5-3b, "):
        checkpoint_dir("qwen4")


@pytest.mark.parametrize("name", EXPECTED)
def test_known_encodings_and_single_token_tags(name):
    tokenizer, expected = load_checkpoint_tokenizer(name), EXPECTED[name]
    bos = [128000] if name.startswith("llama") else []  # Llama's tokenizer adds <|begin_of_text|>; Qwen's adds none
    for text, ids in expected["encodings"].items():
        assert tokenizer.encode(text, add_special_tokens=False) == ids, text
        assert tokenizer.encode(text) == bos + ids, text
    for tag, (token_id, special) in expected["single"].items():
        assert tokenizer.encode(tag, add_special_tokens=False) == [token_id], tag
        assert tokenizer.decode([token_id], skip_special_tokens=True) == ("" if special else tag), tag
    assert len(tokenizer.encode(expected["call"], add_special_tokens=False)) > 2


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_the_vocabulary_and_split_are_the_ones_llama_cpp_recognises(name):
    tokenizer = load_checkpoint_tokenizer(name)
    assert hashlib.sha256(str(tokenizer.encode(CHKTXT)).encode()).hexdigest() == LLAMA_CPP_CHKHSH[name]


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
    kwargs = {"tools": [SEARCH_TOOL], "add_generation_prompt": True, **TEMPLATE_KWARGS.get(name, {})}
    rendered = tokenizer.apply_chat_template(TOOL_CONVERSATION, tokenize=False, **kwargs)
    assert (
        tokenizer.chat_template == (model_tokenizers.TEMPLATES_DIR / model_tokenizers.SPECS[name].template).read_text()
    )
    assert expected["call"] in rendered
    assert expected["result"] in rendered
    thinking_on, thinking_off = expected["prompt_end"]
    assert rendered.endswith(thinking_on)
    quiet = tokenizer.apply_chat_template(TOOL_CONVERSATION, tokenize=False, enable_thinking=False, **kwargs)
    assert quiet.endswith(thinking_off)
    ids = tokenizer.apply_chat_template(TOOL_CONVERSATION, **kwargs)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tokenizer.decode(ids) == rendered  # the rendered prompt round-trips through the real vocabulary
