"""Search-R1's XML action protocol: what the model writes, and what it is shown back."""

import re
from dataclasses import dataclass

STOP_STRINGS = ("</search>", "</answer>")

# First <search>…</search> or <answer>…</answer> in a model turn (Search-R1's postprocess_predictions).
ACTION_PATTERN = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

INFORMATION_OPEN = "\n\n<information>"
INFORMATION_CLOSE = "</information>\n\n"


@dataclass(frozen=True)
class Action:
    kind: str  # "search" | "answer" | "invalid"
    content: str = ""


def parse_action(turn_text: str) -> Action:
    """The first complete action of a model turn; an empty search query counts as invalid."""
    match = ACTION_PATTERN.search(turn_text)
    if match is None:
        return Action("invalid")
    content = match.group(2).strip()
    if match.group(1) == "search" and not content:
        return Action("invalid")
    return Action(match.group(1), content)


def with_stop_strings(stop: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The caller's stop strings plus the action closers, without duplicates."""
    existing = [stop] if isinstance(stop, str) else list(stop or [])
    return list(dict.fromkeys([*existing, *STOP_STRINGS]))


SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


def search_r1_prompt(question: str) -> str:
    """The user-turn text Search-R1's data scripts write ("as your want" is theirs)."""
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return SEARCH_R1_INSTRUCTION.format(question=question)
