"""Search-R1's exact-match reward with its format rules (qa_em and qa_em_format), and the same table over F1, cover
EM or a judge's verdict (SEARCH_R1_REWARD).

s is the answer's score: EM (0 or 1, the default), token F1 or cover EM (slime_search_r1/scoring/answers.py), or the
judge's verdict (1 or 0). With s = EM the rows are Search-R1's own; any other s in [0, 1] mixes a row's "right" and
"wrong" values in proportion: s * right + (1 - s) * wrong.

| answer  | format valid | score                                                                          |
|---------|--------------|--------------------------------------------------------------------------------|
| s = 1   | yes          | 1.0                                                                            |
| s = 1   | no           | 1.0 - format_score                                                             |
| s = 0   | yes          | format_score (+ retrieval_score if a gold answer was retrieved)                |
| s = 0   | no           | final_format_score                                                             |
| s       | yes          | s + (1 - s) * (format_score (+ retrieval_score if a gold answer was retrieved)) |
| s       | no           | s * (1.0 - format_score) + (1 - s) * final_format_score                        |
| none    | yes          | format_score (+ retrieval_score)                                               |
| none    | no           | 0                                                                              |

With format_score = final_format_score = retrieval_score = 0 the score is s itself (pure EM with EM: qa_em). XML
responses are read here (read_response); chat conversations by slime_search_r1/protocols/chat_reward.py (read_chat);
both are scored with the same table (score_reading). The normalisation, the scores and the reading of the last
<answer> live in slime_search_r1/scoring/answers.py and keep their names here.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from slime_search_r1.families import ASSISTANT_HEADERS
from slime_search_r1.protocols.chat_reward import read_conversation
from slime_search_r1.protocols.xml_tags import assistant_prefill, opens_thought, prompt_opens_thought, result_blocks

# Search-R1's normalisation, EM and answer reading are the package's (evaluate.py scores with them too)
from slime_search_r1.scoring.answers import em_check, last_answer, normalize_answer, search_only
from slime_search_r1.tools.contract import Tool


@dataclass(frozen=True)
class FormatAutomaton:
    """Search-R1's order think -> (tool call -> its result -> think)* -> answer, over every enabled tool's tag."""

    tags: tuple[str, ...]
    split: re.Pattern
    transitions: dict[tuple[str, str], str]  # (state, tag) -> next state; text between tags must be whitespace
    inside_tag: frozenset[str]  # states in which text is allowed


@lru_cache(maxsize=8)
def format_automaton(tools: tuple[tuple[str, str], ...]) -> FormatAutomaton:
    """The automaton over (tool name, result tag) pairs: each call is followed by its tool's result block."""
    results = tuple(dict.fromkeys(tag for _, tag in tools))
    tags = ("think", *(name for name, _ in tools), *results, "answer")
    transitions = {
        ("start", "<think>"): "in_think",
        ("in_think", "</think>"): "after_think",
        ("after_think", "<answer>"): "in_answer",
        ("in_answer", "</answer>"): "end",
    }
    for name, result in tools:
        transitions[("after_think", f"<{name}>")] = f"in_{name}"
        transitions[(f"in_{name}", f"</{name}>")] = f"after_{name}"
        transitions[(f"after_{name}", f"<{result}>")] = f"in_{result}"
    for result in results:
        transitions[(f"in_{result}", f"</{result}>")] = "result"
    transitions[("result", "<think>")] = "in_think"
    inside = frozenset({"in_think", "in_answer", *(f"in_{tag}" for tag in (*(name for name, _ in tools), *results))})
    split = re.compile(rf"(</?(?:{'|'.join(map(re.escape, tags))})>)")
    return FormatAutomaton(tags, split, transitions, inside)


def result_tags(tools: Mapping[str, Tool] | Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(tool name, result tag) per tool: a Tool's own, Search-R1's <information> for a bare name."""
    if isinstance(tools, Mapping):
        return tuple((name, tool.result_tag) for name, tool in tools.items())
    return tuple((name, "information") for name in tools)


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
    answer_score: float = 0.0  # s in the table: em's 0/1 unless another score was given


@dataclass(frozen=True)
class Reading:
    """What the reward reads from a response, whichever protocol wrote it."""

    answer: str | None  # the last <answer> the model wrote (None: no answer)
    format_valid: bool
    retrieved: list[str]  # the results of tools that retrieve, where the retrieval bonus looks for a gold answer


def format_problem(prompt: str, response: str, tools: Mapping[str, Tool] | Iterable[str] = ("search",)) -> str | None:
    """Why `response` breaks Search-R1's format after `prompt` with these tools' tags (a Tool's result tag, or
    <information> for a tool given by name), or None when it is valid.

    The rule reads what the model wrote: the response. The prompt must open an assistant turn (Search-R1's marker
    check, over ChatML's and Llama 3's headers), and what its template wrote there counts only for the state it
    leaves the model in: a prefill that opens a thought (Qwen3-Thinking-2507, Qwen3.5 with thinking on: "<think>\n")
    starts the response inside it, so the response closes it; an empty closed thought (Qwen3 and Qwen3.5 with
    enable_thinking=false) is the template's, not the model's first thought, so the response thinks first as under
    every other template. Tags inside a thought break the format, as in Search-R1's rule."""
    prefill = assistant_prefill(prompt)
    if prefill is None:
        return f"missing assistant marker ({' or '.join(ASSISTANT_HEADERS)})"
    in_thought = opens_thought(prefill)
    automaton = format_automaton(result_tags(tools))
    for tag in automaton.tags:
        opened = response.count(f"<{tag}>") + (1 if in_thought and tag == "think" else 0)
        closed = response.count(f"</{tag}>")
        if opened != closed:
            return f"unbalanced <{tag}>: {opened} opening vs {closed} closing"
    state = "in_think" if in_thought else "start"
    for part in automaton.split.split(response):
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


def table_score(
    answer: str | None,
    golden_answers: list[str],
    format_valid: bool,
    hit: bool,
    weights,
    answer_score: float | None = None,
) -> ScoreDetails:
    """The reward table at the top of this module; `answer_score` is s (None: exact match)."""
    em = answer is not None and em_check(answer, golden_answers)
    s = float(em) if answer_score is None else float(answer_score)
    right = weights.correct_score if format_valid else weights.correct_score - weights.format_score
    if format_valid:
        wrong = weights.format_score + (weights.retrieval_score if hit else 0.0)
    else:
        wrong = weights.final_format_score if answer is not None else 0.0
    # exact at s = 1 and s = 0 (1.0 * x + 0.0 * y == x in floating point): EM's rewards are Search-R1's to the bit
    score = s * right + (1.0 - s) * wrong
    return ScoreDetails(
        score=score, em=float(em), format_valid=format_valid, retrieval_hit=hit, answer=answer, answer_score=s
    )


def score_reading(
    reading: Reading, golden_answers: list[str], weights: FormatWeights, answer_score: float | None = None
) -> ScoreDetails:
    """The table for an answer read from either protocol; the retrieval bonus needs a valid format."""
    hit = reading.format_valid and contains_gold(reading.retrieved, golden_answers)
    return table_score(reading.answer, golden_answers, reading.format_valid, hit, weights, answer_score)


def read_response(prompt: str, response: str, tools: Mapping[str, Tool] | None = None) -> Reading:
    """XML mode: the format is checked on prompt + response, the answer read from the response; `tools` are the
    enabled ones (Search-R1's search when None)."""
    tools = tools or search_only()
    format_valid = format_problem(prompt, response, tools) is None
    retrieved = [text for name, text in result_blocks(response, tools) if tools[name].retrieves]
    return Reading(last_answer(response, tools, prompt_opens_thought(prompt)), format_valid, retrieved)


def read_chat(conversation: list[dict], tools: Mapping[str, Tool] | None = None) -> Reading:
    """Chat mode: the recorded conversation's answer, format and tool results (chat_reward.read_conversation)."""
    reading = read_conversation(conversation, tools or search_only())
    return Reading(reading.answer, reading.format_valid, reading.tool_texts)


def score_response(
    prompt: str,
    response: str,
    golden_answers: list[str],
    weights: FormatWeights,
    tools: Mapping[str, Tool] | None = None,
) -> ScoreDetails:
    """Exact match's row for an XML response."""
    return score_reading(read_response(prompt, response, tools), golden_answers, weights)


def score_conversation(
    conversation: list[dict],
    golden_answers: list[str],
    weights: FormatWeights,
    tools: Mapping[str, Tool] | None = None,
) -> ScoreDetails:
    """Exact match's row for a chat conversation."""
    return score_reading(read_chat(conversation, tools), golden_answers, weights)
