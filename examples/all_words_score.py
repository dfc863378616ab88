"""An extension in one file: an answer score of your own, to build the reward on and to see in evaluate.py.

    export PYTHONPATH=$PWD/examples:$PYTHONPATH
    export SEARCH_R1_EXTENSIONS=all_words_score SEARCH_R1_REWARD=all_words

`all_words`: 1 when the answer holds every word of a gold answer, in any order (after Search-R1's normalisation),
so "the capital is Paris, France" scores 1 for "Paris France" where EM scores 0. The reward mixes it into Search-R1's
table as it does F1 (qa_em_format.py); evaluate.py reports it beside EM, F1 and cover EM.
"""

from collections.abc import Iterable

from slime_search_r1.registry import ANSWER_SCORES
from slime_search_r1.scoring.answers import normalize_answer


def all_words(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    if prediction is None:
        return 0.0
    words = set(normalize_answer(prediction).split())
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    return float(any(set(normalize_answer(gold).split()) <= words for gold in golds if normalize_answer(gold)))


ANSWER_SCORES.register("all_words", all_words)
