"""Model families: how a checkpoint's model writes tool calls and thoughts, as data.

A family is one ModelFamily value in a file of its own (qwen25.py, qwen3.py, ...), named in registry.py's
MODEL_FAMILIES; the `model_family` setting (SEARCH_R1_MODEL_FAMILY) names one, or "auto" picks the first whose rule
places the checkpoint's chat template (detection.py), in the registry's order, as SGLang 0.5.23 picks its parsers
from the template (srt/parser/template_detection.py; each family names the rule it follows).

  ModelFamily     its tool-call reader, its SGLang parsers, its reasoning format, its rule
  CallsRead       what a reader makes of an assistant turn: text, calls (name, arguments), calls it cannot read
  Thinking        who opens a thought (nobody, the model, the generation prompt) and the kwarg that turns it off

What every family's template shares is declared once, here, for both modes: the think tags (THINK_TAGS: what
SGLang's qwen3 and deepseek-r1 reasoning parsers read, and what Search-R1's prompt asks the model to think in) and
where a template opens the assistant's turn (ASSISTANT_HEADERS: ChatML's for the Qwen families, Llama 3's). XML mode
reads them as constants (protocols/xml_tags.py), so one episode runs no code of this package.

The end-of-turn and EOS tokens are not declared here: the template and the checkpoint say them
(protocols/chat_template.py reads the end of turn from the template, tokens/engine_rules.py the EOS set).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

NO_THOUGHTS, MODEL_OPENS, PROMPT_OPENS = "none", "model", "prompt"
THINK_TAGS = ("<think>", "</think>")
# What each template writes to open the assistant's turn, before its prefill (an empty thought, or "<think>\n"):
# ChatML's (Qwen2.5, Qwen3, Qwen3.5) and Llama 3's.
ASSISTANT_HEADERS = ("<|im_start|>assistant", "<|start_header_id|>assistant<|end_header_id|>")


@dataclass(frozen=True)
class Thinking:
    """Who writes the opening think tag when thinking is on: nobody (NO_THOUGHTS: the model does not think), the
    model (MODEL_OPENS: its turn begins with `<think>`), or the template's generation prompt (PROMPT_OPENS: the
    prompt ends with `<think>\\n`, the response holds only `</think>`). `toggle`: the chat-template kwarg that turns
    thinking off when False (`enable_thinking`: the prompt then holds an empty, closed thought); which of the two a
    prompt holds, the rendered prompt says (protocols/xml_tags.py prompt_thought)."""

    opened_by: str = NO_THOUGHTS
    toggle: str | None = None


@dataclass
class CallsRead:
    """An assistant turn as a family's reader reads it (the end-of-turn text already removed)."""

    content: str  # the text before the first call
    calls: list[tuple[object, object]] = field(default_factory=list)  # (name, arguments) as the model wrote them
    # (the text of a call the reader cannot read, why): a malformed call, or one in another family's format
    unparsable: list[tuple[str, str]] = field(default_factory=list)
    text_after_calls: str = ""  # what the model wrote after its first call besides whitespace and the calls


# (assistant text, the tool schemas the template shows) -> the turn read
CallReader = Callable[[str, list[dict]], CallsRead]


@dataclass(frozen=True)
class ModelFamily:
    name: str
    models: str  # the checkpoints it covers, for messages and docs
    read_calls: CallReader
    call_format: str  # how one call looks, for messages (a wrong-format call's reason names it)
    tool_call_parser: str  # SGLang's --tool-call-parser that reads the same calls
    reasoning_parser: str | None  # SGLang's --reasoning-parser for its thoughts (None: no thoughts)
    thinking: Thinking
    # (chat template source) -> whether this family's rule places it; `rule` says where the rule comes from
    matches: Callable[[str], bool]
    rule: str
    # the template renders an earlier assistant turn otherwise than as the model wrote it once messages follow (Qwen3
    # drops thoughts before the last user turn): whatever re-renders messages (router_handler) is not token-exact
    rewrites_history: bool = False
    # the most calls its template renders in one assistant turn (None: any); a turn with more is an invalid action,
    # its calls unparsable, so the conversation stays one the template renders (protocols/chat.py)
    calls_per_turn: int | None = None


def think_tag_ids(tokenizer) -> tuple[int | None, int | None]:
    """The ids of the think tags where each is one token of this tokenizer (Qwen3's `<think>` 151667 and `</think>`
    151668), else None (Qwen2.5 and Llama 3 spell them in several tokens)."""
    vocabulary = tokenizer.get_added_vocab()
    return tuple(vocabulary.get(tag) for tag in THINK_TAGS)  # type: ignore[return-value]
