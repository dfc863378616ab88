"""The answer a response gives, and how it scores against the gold answers, with Search-R1's normalisation.

Search-R1 (verl/utils/reward_score/qa_em.py, itself FlashRAG's and SQuAD's) normalises both sides the same way:
lower-case (str.lower, so any script), drop ASCII punctuation (string.punctuation: curly quotes, dashes and other
non-ASCII marks stay), drop the words a, an and the, collapse whitespace. Over that:

  em        the prediction equals a gold answer (Search-R1's em_check)
  cover_em  a gold answer appears inside the prediction, as a substring of the normalised text (Search-R1's
            subem_check, FlashRAG's Sub_ExactMatch; "cover exact match" in R1-Searcher and its successors)
  f1        token F1 between prediction and gold: SQuAD's bag-of-words precision and recall, with HotpotQA's and
            FlashRAG's rule that a "yes", "no" or "noanswer" on either side counts only when both sides are equal

Several gold answers: each score is the best over them (em and cover_em: any gold; f1: the highest F1), as Search-R1,
FlashRAG and the SQuAD and HotpotQA scripts do. A response with no answer scores 0 on each.
"""

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping

from slime_search_r1.episode import conversation_of, episode_record
from slime_search_r1.protocols.chat_reward import read_conversation
from slime_search_r1.protocols.xml_tags import (
    ANSWER_PATTERN,
    invalid_action_message,
    outside_thoughts,
    prompt_opens_thought,
)
from slime_search_r1.registry import ANSWER_SCORES, TOOLS
from slime_search_r1.tools.contract import Tool

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_F1_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """SQuAD normalisation as Search-R1 applies it: lower-case, drop punctuation and articles, collapse whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(golden_answers: str | Iterable[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def em_check(prediction: str, golden_answers: str | Iterable[str]) -> bool:
    normalized = normalize_answer(prediction)
    return any(normalize_answer(gold) == normalized for gold in _golds(golden_answers))


def cover_em_check(prediction: str, golden_answers: str | Iterable[str]) -> bool:
    normalized = normalize_answer(prediction)
    return any(normalize_answer(gold) in normalized for gold in _golds(golden_answers))


def _token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction), normalize_answer(gold)
    if (predicted in _F1_SPECIAL or expected in _F1_SPECIAL) and predicted != expected:
        return 0.0
    common = sum((Counter(predicted.split()) & Counter(expected.split())).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted.split()), common / len(expected.split())
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golden_answers: str | Iterable[str]) -> float:
    return max((_token_f1(prediction, gold) for gold in _golds(golden_answers)), default=0.0)


def exact_match(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    return float(prediction is not None and em_check(prediction, golden_answers))


def cover_exact_match(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    return float(prediction is not None and cover_em_check(prediction, golden_answers))


def f1_score(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    return 0.0 if prediction is None else token_f1(prediction, golden_answers)


def rule_scores(prediction: str | None, golden_answers: str | Iterable[str]) -> dict[str, float]:
    """Every answer score of one prediction, by name (registry.ANSWER_SCORES: these three and any an extension
    registers), in the order reports show them."""
    return {name: ANSWER_SCORES.get(name)(prediction, golden_answers) for name in ANSWER_SCORES.names()}


def search_only() -> dict[str, Tool]:
    """The tools when none are named: Search-R1's one."""
    return {"search": TOOLS.get("search")}


def last_answer(response: str, tools: Mapping[str, Tool] | None = None, in_thought: bool = False) -> str | None:
    """The last <answer>…</answer> the model wrote in an XML-mode response.

    Search-R1 searches prompt + response and needs two matches because its prompt holds one example
    answer; searching the response alone gives the same answer for that prompt and does not depend on it.
    The environment's text is left out: the invalid-action hint itself says "<answer> and </answer>",
    and a retrieved page may hold answer tags. So are the model's thoughts, where a tag is never an action
    (`in_thought`: the response starts inside one its prompt opened).
    """
    tools = tools or search_only()
    written = response.replace(invalid_action_message(tools.values()), " ")
    for tag in {tool.result_tag for tool in tools.values()}:
        written = re.sub(rf"<{re.escape(tag)}>.*?</{re.escape(tag)}>", " ", written, flags=re.DOTALL)
    matches = [answer for run in outside_thoughts(written, in_thought) for answer in ANSWER_PATTERN.findall(run)]
    return matches[-1].strip() if matches else None


def answer_of(sample, tools: Mapping[str, Tool] | None = None) -> str | None:
    """The answer reward_func scored: the final chat message's (the record's conversation), or the last <answer> of
    an XML response outside its thoughts (one a string prompt opened included); `tools`: the enabled ones
    (Search-R1's search when None)."""
    conversation = conversation_of(episode_record(sample) or {})
    if conversation is not None:
        return read_conversation(conversation, tools or search_only()).answer
    prompt = getattr(sample, "prompt", None)
    return last_answer(sample.response or "", tools, isinstance(prompt, str) and prompt_opens_thought(prompt))
