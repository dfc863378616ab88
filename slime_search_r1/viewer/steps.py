"""A sample's response as the page shows it: the model's turns and what it was shown between them, and its tool calls.

With token ids, the loss mask draws the line: a run of trained tokens is what the model wrote, a run of masked tokens
is what it was shown (a tool's result, a hint). Without them (an evaluate.py line written without --viewer), XML
responses are split at their <information> blocks. Tool calls are read by tool name, whichever tools exist: chat mode
from the recorded conversation (each call with its tool message), XML mode from each turn's first action tag and the
<information> block that follows it.
"""

import json
import re
from dataclasses import dataclass

from slime_search_r1.episode import conversation_of, tool_counters
from slime_search_r1.protocols.xml_tags import INFORMATION_CLOSE, INFORMATION_OPEN, INFORMATION_PATTERN, action_tags
from slime_search_r1.registry import TOOLS
from slime_search_r1.viewer.samples import ViewSample
from slime_search_r1.viewer.vocabulary import Vocabulary

MODEL = "model"  # what the model wrote (loss mask 1)
SHOWN = "shown"  # what the model was shown (loss mask 0)
_INFORMATION_BLOCK = re.compile(re.escape(INFORMATION_OPEN) + r".*?" + re.escape(INFORMATION_CLOSE), re.DOTALL)


@dataclass
class Step:
    kind: str  # MODEL or SHOWN
    text: str
    start: int | None = None  # response token range, when the sample has token ids
    end: int | None = None


def token_steps(mask: list[int], response_ids: list[int], vocabulary: Vocabulary) -> list[Step]:
    """Runs of equal loss mask, with their text."""
    steps: list[Step] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            kind = MODEL if mask[start] else SHOWN
            steps.append(Step(kind, vocabulary.decode(response_ids[start:i]), start, i))
            start = i
    return steps


def text_steps(response: str) -> list[Step]:
    """An XML response without token ids, split at its <information> blocks."""
    steps, position = [], 0
    for match in _INFORMATION_BLOCK.finditer(response):
        if match.start() > position:
            steps.append(Step(MODEL, response[position : match.start()]))
        steps.append(Step(SHOWN, match.group(0)))
        position = match.end()
    if position < len(response) or not steps:
        steps.append(Step(MODEL, response[position:]))
    return steps


def steps_of(sample: ViewSample, vocabulary: Vocabulary | None) -> list[Step]:
    ids, mask = sample.response_ids, sample.loss_mask
    if vocabulary is not None and ids is not None and mask is not None and len(mask) == len(ids):
        return token_steps(mask, ids, vocabulary)
    return text_steps(sample.response)


def tool_calls(sample: ViewSample, steps: list[Step]) -> list[dict]:
    """Every tool call: {turn, name, arguments, result, call_id}; result None when nothing answered it."""
    record = sample.record or {}
    conversation = conversation_of(record)
    if isinstance(conversation, list):
        return _chat_calls(conversation)
    return _xml_calls(steps, {*TOOLS.names(), *tool_counters(record)})


def _chat_calls(conversation: list[dict]) -> list[dict]:
    results = {m.get("tool_call_id"): m.get("content") for m in conversation if m.get("role") == "tool"}
    calls, turn = [], 0
    for message in conversation:
        if message.get("role") != "assistant":
            continue
        turn += 1
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass  # shown as the model wrote it
            calls.append(
                {
                    "turn": turn,
                    "name": function.get("name"),
                    "arguments": arguments,
                    "result": results.get(call.get("id")),
                    "call_id": call.get("id"),
                }
            )
    return calls


def _xml_calls(steps: list[Step], tools: set[str]) -> list[dict]:
    pattern = re.compile(rf"<({'|'.join(map(re.escape, action_tags(sorted(tools))))})>(.*?)</\1>", re.DOTALL)
    calls, turn = [], 0
    for i, step in enumerate(steps):
        if step.kind != MODEL:
            continue
        turn += 1
        match = pattern.search(step.text)
        if match is None or match.group(1) == "answer":
            continue
        result = None
        if i + 1 < len(steps) and steps[i + 1].kind == SHOWN:
            shown = steps[i + 1].text
            information = INFORMATION_PATTERN.search(shown)
            result = information.group(1) if information else shown
        calls.append({"turn": turn, "name": match.group(1), "arguments": match.group(2), "result": result})
    return calls
