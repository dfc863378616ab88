"""LLM_API_MODE=generate: Search-R1's tags. `<search> q </search>` calls a tool, `<answer>...</answer>` ends the
episode, anything else gets the invalid-action message; a tool's result comes back between its result tags
(Search-R1's <information> for search and access).

Every enabled tool is a tag (tools/): its text fills the tool's `xml_argument`. Generation stops at each tag's
closing string; slime sends no_stop_trim, so the closing tag stays in the turn. With only `search` enabled the
prompt and the messages are Search-R1's own, word for word; another tool adds its sentence to each.

Thoughts: text between <think> and </think> is the model's reasoning, never an action, whatever tags it quotes
(a thinking model often writes "I should put the answer between <answer> and </answer>"). A text whose first thought
marker is </think> began inside a thought: the chat template's generation prompt opened it (Qwen3-Thinking-2507's and
Qwen3.5's end with "<think>\n"). In Qwen3 and later the markers are single added tokens; they decode to the same text,
which is what is read here (as SGLang's reasoning parsers read it). The tags and the assistant headers are the model
families' (families/__init__.py), read from the prompt the template rendered: which family wrote it is not needed, so
an episode resolves none.
"""

import logging
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from slime_search_r1.episode import Action, Reply, Turn, encode_text, fixed_text_ids
from slime_search_r1.families import ASSISTANT_HEADERS, THINK_TAGS
from slime_search_r1.protocols.chat_template import chat_template_kwargs, template_end_of_turn, turn_stop_ids
from slime_search_r1.tools.contract import Tool, read_call

logger = logging.getLogger(__name__)

ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
THINK_OPEN, THINK_CLOSE = THINK_TAGS
_THOUGHT_MARKER = re.compile(f"{re.escape(THINK_OPEN)}|{re.escape(THINK_CLOSE)}")
# A template's assistant header and the whitespace after it; what the generation prompt writes next (an empty
# thought, or "<think>\n") is its prefill.
ASSISTANT_OPENING = re.compile("|".join(rf"{re.escape(header)}\s*" for header in ASSISTANT_HEADERS))
INFORMATION_PATTERN = re.compile(r"<information>(.*?)</information>", re.DOTALL)
INFORMATION_OPEN = "\n\n<information>"
INFORMATION_CLOSE = "</information>\n\n"
# Search-R1's instruction says how search results come back; another tool's sentence follows this one.
TOOL_LINES_AFTER = "it will return the top searched results between <information> and </information>."
_ANSWER_USAGE = "If I want to give the final answer, I should put the answer between <answer> and </answer>."
# SEARCH_R1_FORCE_ANSWER=inject: the instruction, at the end of the reply before the forced turn. Inside an
# <information> block when the reply is one, so Search-R1's format rule (think, call, information, think, answer)
# still holds; no tags, which would break that rule there.
FORCE_ANSWER_NOTE = "\n\n(No more tool calls will be answered: give the final answer now.)"


def invalid_action_message(tools: Iterable[Tool]) -> str:
    """What the model is shown after a turn with no usable action: Search-R1's message, naming every tool's tag."""
    usages = " ".join([*(tool.xml_usage for tool in tools), _ANSWER_USAGE])
    return f"\nMy previous action is invalid. {usages} Let me try again.\n"


def action_tags(tools: Iterable[str]) -> tuple[str, ...]:
    """The tags a model turn may act with: every tool's name, then "answer"."""
    return (*tools, "answer")


def stop_strings(tools: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"</{tag}>" for tag in action_tags(tools))


@lru_cache(maxsize=8)
def _action_pattern(tags: tuple[str, ...]) -> re.Pattern:
    # The first complete <tag>...</tag> of a turn, as Search-R1's postprocess_predictions reads it.
    return re.compile(rf"<({'|'.join(map(re.escape, tags))})>(.*?)</\1>", re.DOTALL)


def assistant_prefill(prompt: str) -> str | None:
    """What the chat template wrote after the prompt's last assistant opening (its generation prompt's prefill, ""
    for Qwen2.5 and Llama 3), or None when the prompt opens no assistant turn."""
    openings = list(ASSISTANT_OPENING.finditer(prompt))
    return prompt[openings[-1].end() :] if openings else None


def opens_thought(text: str) -> bool:
    """Whether `text` leaves a thought open: its last thought marker is <think>."""
    return text.rfind(THINK_OPEN) > text.rfind(THINK_CLOSE)


def prompt_thought(prompt: str) -> str:
    """What the prompt's assistant prefill leaves the model's turn: "open" (it starts inside a thought the prompt
    opened: the response holds only the closing tag), "closed" (the prefill holds an empty thought: the template's
    thinking is off), or "none"."""
    prefill = assistant_prefill(prompt) or ""
    if opens_thought(prefill):
        return "open"
    return "closed" if THINK_CLOSE in prefill else "none"


def prompt_opens_thought(prompt: str) -> bool:
    """Whether the model's turn starts inside a thought the prompt's assistant prefill opened."""
    return opens_thought(assistant_prefill(prompt) or "")


def outside_thoughts(text: str, in_thought: bool = False) -> list[str]:
    """The runs of `text` outside its thoughts: each <think> to the next </think> (or the end) is left out, and so is
    everything before the first </think> when the text starts `in_thought` or its first marker is </think> (a thought
    its prompt, or its turn before a reply, opened)."""
    runs, start, inside = [], 0, in_thought
    for index, marker in enumerate(_THOUGHT_MARKER.finditer(text)):
        if marker.group() == THINK_OPEN and not inside:
            runs.append(text[start : marker.start()])
            inside = True
        elif marker.group() == THINK_CLOSE and (inside or index == 0):
            start, inside = marker.end(), False
    if not inside:
        runs.append(text[start:])
    return runs


def read_action(text: str, tools: Mapping[str, Tool], turn_index: int = 0, in_thought: bool = False) -> Action:
    """The first complete action of a model turn outside its thoughts (`in_thought`: the turn starts inside one); a
    tool call whose text its tool refuses (an empty query) is invalid, like no action at all."""
    pattern = _action_pattern(action_tags(tools))
    match = next((found for run in outside_thoughts(text, in_thought) if (found := pattern.search(run))), None)
    if match is None:
        return Action(invalid=True)
    tag, content = match.group(1), match.group(2)
    if tag == "answer":
        return Action(final=True)
    call = read_call(f"call_{turn_index}_0", tag, {tools[tag].xml_argument: content}, tools)
    return Action(invalid=True) if call.error else Action(calls=[call])


def result_blocks(response: str, tools: Mapping[str, Tool]) -> list[tuple[str, str]]:
    """(tool name, text) of every result block in a response, each credited to the call before it: what the model
    was shown of each tool. The invalid-action message, which names the tags, is read as no call."""
    text = response.replace(invalid_action_message(tools.values()), " ")
    tags = {*tools, *(tool.result_tag for tool in tools.values())}
    blocks, called = [], None
    for match in _block_pattern(tuple(sorted(tags))).finditer(text):
        tag, content = match.group(1), match.group(2)
        if called is not None and tag == tools[called].result_tag:
            blocks.append((called, content))
            called = None
        elif tag in tools:
            called = tag
    return blocks


@lru_cache(maxsize=8)
def _block_pattern(tags: tuple[str, ...]) -> re.Pattern:
    return re.compile(rf"<({'|'.join(map(re.escape, tags))})>(.*?)</\1>", re.DOTALL)


def with_stop_strings(stop: str | list[str] | tuple[str, ...] | None, tools: Iterable[str]) -> list[str]:
    """The caller's stop strings plus the action closers, without duplicates."""
    existing = [stop] if isinstance(stop, str) else list(stop or [])
    return list(dict.fromkeys([*existing, *stop_strings(tools)]))


def information_ids(
    tokenizer, documents: str, max_tokens: int, note: str = "", tag: str = "information"
) -> tuple[list[int], bool]:
    """`\\n\\n<information>{documents}</information>\\n\\n` in at most `max_tokens` ids (another tool's result between
    its own `tag`); True if documents were cut.

    The block is always tokenized whole, as one string (what Search-R1 feeds, and what tokenizing the
    rendered text gives): when it does not fit, the documents are cut at a token boundary, the tags kept,
    and the cut block tokenized whole again. A `note` (the forced-answer instruction) follows the documents inside
    the block, outside their budget: they are cut as they are without it.
    """
    opening, closing = block_tags(tag)
    block, kept, cut = _block_within(tokenizer, documents, max_tokens, opening, closing)
    if note:
        block = encode_text(tokenizer, f"{opening}{kept}{note}{closing}")
    return block, cut


def block_tags(tag: str) -> tuple[str, str]:
    """What a result block opens and closes with: Search-R1's blank lines around <tag> and </tag>."""
    return (INFORMATION_OPEN, INFORMATION_CLOSE) if tag == "information" else (f"\n\n<{tag}>", f"</{tag}>\n\n")


def _block_within(
    tokenizer, documents: str, max_tokens: int, opening: str, closing: str
) -> tuple[list[int], str, bool]:
    """The block of `documents` in at most `max_tokens` ids, the documents' text it holds, and whether they were
    cut."""
    whole = encode_text(tokenizer, f"{opening}{documents}{closing}")
    if len(whole) <= max_tokens:
        return whole, documents, False
    doc_ids = encode_text(tokenizer, documents)
    tags = len(fixed_text_ids(tokenizer, opening)) + len(fixed_text_ids(tokenizer, closing))
    keep = max(0, max_tokens - tags)
    while True:
        kept = tokenizer.decode(doc_ids[:keep], skip_special_tokens=False)
        block = encode_text(tokenizer, f"{opening}{kept}{closing}")
        if len(block) <= max_tokens or keep == 0:
            return block, kept, True
        # the cut text merged into more tokens than counted: drop the excess, and at least one token, so every
        # attempt is shorter than the last and the cut ends within len(doc_ids) attempts whatever it finds
        keep = max(0, keep - max(1, len(block) - max_tokens))


_warned_prompts: set[str] = set()


def prompt_text(args, tokenizer, sample, tools: Mapping[str, Tool]) -> str:
    """The prompt the episode conditions on: the string slime's --apply-chat-template left (rendered here when the
    sample holds messages), with the sentence of each enabled tool beyond search after Search-R1's own."""
    if isinstance(sample.prompt, str):
        text = sample.prompt
    else:
        text = tokenizer.apply_chat_template(
            list(sample.prompt), tokenize=False, add_generation_prompt=True, **chat_template_kwargs(args, sample)
        )
    lines = [tool.prompt_line for tool in tools.values() if tool.prompt_line]
    if not lines:
        return text
    if TOOL_LINES_AFTER not in text:
        missing = ", ".join(name for name, tool in tools.items() if tool.prompt_line)
        if missing not in _warned_prompts:
            _warned_prompts.add(missing)
            logger.warning(
                "the prompt does not hold Search-R1's instruction, so it was left as it is: say in your data how "
                "to call %s (%s)",
                missing,
                " ".join(lines),
            )
        return text
    return text.replace(TOOL_LINES_AFTER, " ".join([TOOL_LINES_AFTER, *lines]), 1)


class XmlProtocol:
    records_conversation = False
    messages = None  # what the router_handler driver would send: XML mode has no messages
    tool_schemas = None

    def __init__(self, state, sampling_params: dict):
        self.tokenizer = state.tokenizer
        self.tools = state.tools
        self.prompt_text = prompt_text(state.args, state.tokenizer, state.sample, self.tools)
        # The first turn starts inside a thought when the template's generation prompt opened one; a reply ends the
        # model's turn, so a later one is read from outside (or from its first </think>, outside_thoughts).
        self.starts_in_thought = prompt_opens_thought(self.prompt_text)
        # A chat template that frames the prompt ends the model's turn with its end-of-turn token (<|im_end|>), which
        # a base model's EOS set lacks: it is sent, with the tokenizer's EOS, so every served model stops there.
        end_text, end_token = template_end_of_turn(self.tokenizer, chat_template_kwargs(state.args, state.sample))
        framed = end_token if end_text.strip() and end_text.strip() in self.prompt_text else None
        self.sampling_params = {
            **sampling_params,
            "stop": with_stop_strings(sampling_params.get("stop"), self.tools),
            "stop_token_ids": turn_stop_ids(sampling_params, self.tokenizer, framed),
        }
        self.cut_at_stops = stop_strings(self.tools)  # an engine that ignores stop strings is cut after the first
        self.invalid_action_ids = list(fixed_text_ids(self.tokenizer, invalid_action_message(self.tools.values())))

    def read(self, turn: Turn, state) -> Action:
        return read_action(turn.text, self.tools, state.turn_index, self.starts_in_thought and state.turn_index == 0)

    def reply(self, action: Action, results: dict[str, str], turn: Turn, state, force_answer: bool = False) -> Reply:
        """The result of the turn's call in its tool's block (<information>), or the invalid-action message; with
        `force_answer`, the instruction to answer now at its end (FORCE_ANSWER_NOTE)."""
        note = FORCE_ANSWER_NOTE if force_answer else ""
        if not action.calls:
            if note:  # the turn broke the format already: the note follows the message
                return Reply(list(fixed_text_ids(self.tokenizer, invalid_action_message(self.tools.values()) + note)))
            return Reply(list(self.invalid_action_ids))
        call = action.calls[0]
        tool = self.tools[call.name]
        ids, truncated = information_ids(
            self.tokenizer, results[call.call_id], tool.observation_budget(state.config), note, tool.result_tag
        )
        return Reply(ids, truncated=int(truncated))
