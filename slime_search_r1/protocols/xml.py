"""LLM_API_MODE=generate: Search-R1's tags. `<search> q </search>` calls a tool, `<answer>...</answer>` ends the
episode, anything else gets the invalid-action message; a tool's result comes back inside <information>.

Every registered tool is a tag (protocols/tools.py): its text fills the tool's `xml_argument`. Generation stops
at each tag's closing string; slime sends no_stop_trim, so the closing tag stays in the turn.
"""

import re
from functools import lru_cache

from slime.utils.types import Sample
from slime_search_r1.protocols.actions import Action, Reply
from slime_search_r1.protocols.chat_template import chat_template_kwargs
from slime_search_r1.protocols.tools import TOOLS, check_call
from slime_search_r1.state import EpisodeState
from slime_search_r1.tokens.engine import Turn
from slime_search_r1.tokens.text import encode_text, fixed_text_ids

ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INFORMATION_PATTERN = re.compile(r"<information>(.*?)</information>", re.DOTALL)
INFORMATION_OPEN = "\n\n<information>"
INFORMATION_CLOSE = "</information>\n\n"
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def action_tags() -> tuple[str, ...]:
    """The tags a model turn may act with: every tool's name, then "answer"."""
    return (*TOOLS, "answer")


def stop_strings() -> tuple[str, ...]:
    return tuple(f"</{tag}>" for tag in action_tags())


@lru_cache(maxsize=8)
def _action_pattern(tags: tuple[str, ...]) -> re.Pattern:
    # The first complete <tag>...</tag> of a turn, as Search-R1's postprocess_predictions reads it.
    return re.compile(rf"<({'|'.join(map(re.escape, tags))})>(.*?)</\1>", re.DOTALL)


def read_action(text: str, turn_index: int = 0) -> Action:
    """The first complete action of a model turn; a tool call whose text its tool refuses (an empty query) is
    invalid, like no action at all."""
    match = _action_pattern(action_tags()).search(text)
    if match is None:
        return Action(invalid=True)
    tag, content = match.group(1), match.group(2)
    if tag == "answer":
        return Action(final=True)
    call = check_call(f"call_{turn_index}_0", tag, {TOOLS[tag].xml_argument: content})
    return Action(invalid=True) if call.error else Action(calls=[call])


def with_stop_strings(stop: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The caller's stop strings plus the action closers, without duplicates."""
    existing = [stop] if isinstance(stop, str) else list(stop or [])
    return list(dict.fromkeys([*existing, *stop_strings()]))


def information_ids(tokenizer, documents: str, max_tokens: int) -> tuple[list[int], bool]:
    """`\\n\\n<information>{documents}</information>\\n\\n` in at most `max_tokens` ids; True if documents were cut.

    The block is always tokenized whole, as one string (what Search-R1 feeds, and what tokenizing the
    rendered text gives): when it does not fit, the documents are cut at a token boundary, the tags kept,
    and the cut block tokenized whole again.
    """
    whole = encode_text(tokenizer, f"{INFORMATION_OPEN}{documents}{INFORMATION_CLOSE}")
    if len(whole) <= max_tokens:
        return whole, False
    doc_ids = encode_text(tokenizer, documents)
    tags = len(fixed_text_ids(tokenizer, INFORMATION_OPEN)) + len(fixed_text_ids(tokenizer, INFORMATION_CLOSE))
    keep = max(0, max_tokens - tags)
    while True:
        kept = tokenizer.decode(doc_ids[:keep], skip_special_tokens=False)
        block = encode_text(tokenizer, f"{INFORMATION_OPEN}{kept}{INFORMATION_CLOSE}")
        if len(block) <= max_tokens or keep == 0:
            return block, True
        keep = max(0, keep - (len(block) - max_tokens))  # the cut text merged into more tokens than counted


def prompt_string(args, tokenizer, sample: Sample) -> str:
    """The prompt as slime's --apply-chat-template leaves it, rendering messages here if it did not."""
    if isinstance(sample.prompt, str):
        return sample.prompt
    return tokenizer.apply_chat_template(
        list(sample.prompt), tokenize=False, add_generation_prompt=True, **chat_template_kwargs(args, sample)
    )


class XmlProtocol:
    def __init__(self, state: EpisodeState, sampling_params: dict):
        self.tokenizer = state.tokenizer
        self.prompt_text = prompt_string(state.args, state.tokenizer, state.sample)
        self.sampling_params = {**sampling_params, "stop": with_stop_strings(sampling_params.get("stop"))}
        self.cut_at_stops = stop_strings()  # an engine that ignores stop strings is cut after the first one

    def read(self, turn: Turn, state: EpisodeState) -> Action:
        return read_action(turn.text, state.turn_index)

    async def reply(self, action: Action, turn: Turn, state: EpisodeState) -> Reply:
        if not action.calls:
            return Reply(list(fixed_text_ids(self.tokenizer, INVALID_ACTION_MESSAGE)))
        call = action.calls[0]
        documents = await TOOLS[call.name].run(state, call.queries)
        ids, truncated = information_ids(self.tokenizer, documents, state.config.max_obs_tokens)
        return Reply(ids, truncated=int(truncated))
