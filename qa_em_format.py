"""Search-R1's exact-match reward with its format rules (qa_em and qa_em_format).

| answer  | format valid | score                                                            |
|---------|--------------|------------------------------------------------------------------|
| correct | yes          | 1.0                                                              |
| correct | no           | 1.0 - format_score                                               |
| wrong   | yes          | format_score (+ retrieval_score if a gold answer was retrieved)  |
| wrong   | no           | final_format_score                                               |
| none    | yes          | format_score (+ retrieval_score)                                 |
| none    | no           | 0                                                                |

With format_score = final_format_score = retrieval_score = 0 this is plain EM (qa_em). XML responses are read
here (score_response); chat conversations are read by slime_search_r1/protocols/chat_reward.py and scored with
the same table (score_conversation). The normalisation, exact match and the reading of the last <answer> live in
slime_search_r1/scoring/answers.py (with F1 and cover EM) and keep their names here.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from slime_search_r1.protocols.chat_reward import read_conversation
from slime_search_r1.protocols.xml_tags import INFORMATION_PATTERN

# Search-R1's normalisation, EM and answer reading are the package's (evaluate.py scores with them too)
from slime_search_r1.scoring.answers import em_check, last_answer, normalize_answer, search_only
from slime_search_r1.tools.contract import Tool

ASSISTANT_MARKER = re.compile(r"<\|im_start\|>assistant\s*")


@dataclass(frozen=True)
class FormatAutomaton:
    """Search-R1's order think -> (tool call -> information -> think)* -> answer, over every enabled tool's tag."""

    tags: tuple[str, ...]
    split: re.Pattern
    transitions: dict[tuple[str, str], str]  # (state, tag) -> next state; text between tags must be whitespace
    inside_tag: frozenset[str]  # states in which text is allowed


@lru_cache(maxsize=8)
def format_automaton(tools: tuple[str, ...]) -> FormatAutomaton:
    tags = ("think", *tools, "information", "answer")
    transitions = {
        ("start", "<think>"): "in_think",
        ("information", "<think>"): "in_think",
        ("in_think", "</think>"): "after_think",
        ("after_call", "<information>"): "in_information",
        ("in_information", "</information>"): "information",
        ("after_think", "<answer>"): "in_answer",
        ("in_answer", "</answer>"): "end",
    }
    for tool in tools:
        transitions[("after_think", f"<{tool}>")] = f"in_{tool}"
        transitions[(f"in_{tool}", f"</{tool}>")] = "after_call"
    inside = frozenset({"in_think", "in_information", "in_answer", *(f"in_{tool}" for tool in tools)})
    split = re.compile(rf"(</?(?:{'|'.join(map(re.escape, tags))})>)")
    return FormatAutomaton(tags, split, transitions, inside)


@dataclass(frozen=True)
class FormatWeights:
    format_score: float = 0.0  # Search-R1's structure_format_score
    final_format_score: float = 0.0
    retrieval_score: float = 0.0
    correct_score: float = 1.0


@dataclass(frozen=True)
class ScoreDetails:
    score: float
    em: float
    format_valid: bool
    retrieval_hit: bool
    answer: str | None


def format_problem(text: str, tools: Iterable[str] = ("search",)) -> str | None:
    """Why `text` (prompt + response) breaks Search-R1's format with these tools' tags, or None when it is valid."""
    marker = ASSISTANT_MARKER.search(text)
    if marker is None:
        return "missing <|im_start|>assistant marker"
    content = text[marker.end() :]
    automaton = format_automaton(tuple(tools))
    for tag in automaton.tags:
        opened, closed = content.count(f"<{tag}>"), content.count(f"</{tag}>")
        if opened != closed:
            return f"unbalanced <{tag}>: {opened} opening vs {closed} closing"
    state = "start"
    for part in automaton.split.split(content):
        if not part.strip():
            continue
        if automaton.split.fullmatch(part):
            next_state = automaton.transitions.get((state, part))
            if next_state is None:
                return f"unexpected {part} in state {state}"
            state = next_state
        elif state not in automaton.inside_tag:
            return f"unexpected text {part.strip()[:40]!r} in state {state}"
    return None if state == "end" else f"incomplete sequence, ended in state {state}"


def contains_gold(texts: Iterable[str], golden_answers: Iterable[str]) -> bool:
    """Whether any normalised gold answer appears inside any of the normalised texts (retrieved documents)."""
    normalized = [normalize_answer(text) for text in texts]
    golds = [normalize_answer(gold) for gold in golden_answers]
    return any(gold in text for text in normalized for gold in golds)


def table_score(answer: str | None, golden_answers: list[str], format_valid: bool, hit: bool, weights) -> ScoreDetails:
    """The reward table at the top of this module."""
    em = answer is not None and em_check(answer, golden_answers)
    if em:
        score = weights.correct_score if format_valid else weights.correct_score - weights.format_score
    elif format_valid:
        score = weights.format_score + (weights.retrieval_score if hit else 0.0)
    else:
        score = weights.final_format_score if answer is not None else 0.0
    return ScoreDetails(score=score, em=float(em), format_valid=format_valid, retrieval_hit=hit, answer=answer)


def score_answer(
    answer: str | None, golden_answers: list[str], format_valid: bool, retrieved: list[str], weights: FormatWeights
) -> ScoreDetails:
    """The table for an answer read from either protocol; the retrieval bonus needs a valid format."""
    hit = format_valid and contains_gold(retrieved, golden_answers)
    return table_score(answer, golden_answers, format_valid, hit, weights)


def score_response(
    prompt: str,
    response: str,
    golden_answers: list[str],
    weights: FormatWeights,
    tools: Mapping[str, Tool] | None = None,
) -> ScoreDetails:
    """XML mode: the format is checked on prompt + response, the answer read from the response; `tools` are the
    enabled ones (Search-R1's search when None)."""
    tools = tools or search_only()
    format_valid = format_problem(prompt + response, tools) is None
    retrieved = INFORMATION_PATTERN.findall(response)
    return score_answer(last_answer(response, tools), golden_answers, format_valid, retrieved, weights)


def score_conversation(
    conversation: list[dict],
    golden_answers: list[str],
    weights: FormatWeights,
    tools: Mapping[str, Tool] | None = None,
) -> ScoreDetails:
    """Chat mode: the recorded conversation's format, answer and tool results (chat_reward.read_conversation)."""
    reading = read_conversation(conversation, tools or search_only())
    return score_answer(reading.answer, golden_answers, reading.format_valid, reading.tool_texts, weights)
