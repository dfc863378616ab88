"""EM, F1 and cover EM (slime_search_r1/scoring/answers.py) against a table computed by hand.

Normalisation is Search-R1's: lower-case, ASCII punctuation and the articles a/an/the dropped, whitespace collapsed.
F1 is over the normalised tokens; with several gold answers every score is the best over them. The F1 column is
worked out in the comment of each row: common tokens c, prediction tokens p, gold tokens g, F1 = 2c / (p + g).
"""

import pytest

import qa_em_format
from slime_search_r1.registry import ANSWER_SCORES
from slime_search_r1.scoring.answers import rule_scores

TWO_THIRDS = 2 / 3
HAND_TABLE = [
    # prediction, gold answers, EM, F1, cover EM
    ("Paris", ["Paris"], 1, 1, 1),
    ("paris", ["Paris"], 1, 1, 1),  # case
    ("The Paris", ["Paris"], 1, 1, 1),  # an article
    ("Paris.", ["Paris"], 1, 1, 1),  # punctuation
    ("  Paris \n", ["Paris"], 1, 1, 1),  # whitespace
    ("Paris, France", ["Paris"], 0, TWO_THIRDS, 1),  # c1 p2 g1
    ("France", ["Paris"], 0, 0, 0),
    ("", ["Paris"], 0, 0, 0),  # an empty answer
    (None, ["Paris"], 0, 0, 0),  # no <answer> at all
    ("Paris Paris", ["Paris"], 0, TWO_THIRDS, 1),  # tokens counted as a bag: c1 p2 g1
    ("Mount Everest", ["Mount Everest", "Everest"], 1, 1, 1),
    ("Everest", ["Mount Everest", "Everest"], 1, 1, 1),  # the second gold: F1 max(2/3, 1)
    ("Mt. Everest", ["Mount Everest", "Everest"], 0, TWO_THIRDS, 1),  # max(c1 p2 g2 = 1/2, c1 p2 g1 = 2/3)
    ("Marie Curie", ["Albert Einstein", "Marie Curie"], 1, 1, 1),
    ("Marie", ["Albert Einstein", "Marie Curie"], 0, TWO_THIRDS, 0),  # max(0, c1 p1 g2)
    ("Barack Obama", ["Obama", "Barack Hussein Obama"], 0, 0.8, 1),  # max(c1 p2 g1 = 2/3, c2 p2 g3 = 4/5)
    ("van Rossum", ["Guido van Rossum"], 0, 0.8, 0),  # c2 p2 g3
    ("Guido van Rossum created Python", ["Guido van Rossum"], 0, 0.75, 1),  # c3 p5 g3
    ("NEW YORK", ["New York City"], 0, 0.8, 0),  # c2 p2 g3
    ("New\nYork  City", ["New York City"], 1, 1, 1),
    ("the United States of America", ["United States"], 0, TWO_THIRDS, 1),  # c2 p4 g2
    ("an apple a day", ["apple day"], 1, 1, 1),  # every article goes
    ("U.S.", ["US"], 1, 1, 1),
    ("1,990", ["1990"], 1, 1, 1),
    ("19", ["1990"], 0, 0, 0),
    ("Theater", ["the ater"], 0, 0, 1),  # cover EM is a substring test on the text, not on whole words
    ("yes", ["yes"], 1, 1, 1),
    ("no", ["yes"], 0, 0, 0),
    ("yes", ["yes it is"], 0, 0, 0),  # F1: a yes/no/noanswer counts only when both sides are equal
    ("Yes, it is.", ["yes"], 0, 0, 1),  # the same rule on the gold's side; the gold is still inside
    ("ZÜRICH", ["Zürich"], 1, 1, 1),  # lower-casing is Unicode's
    ("Zürich", ["Zurich"], 0, 0, 0),  # but accents are not folded
    ("\u201cParis\u201d", ["Paris"], 0, 0, 1),  # curly quotes are not ASCII punctuation: they stay
    ("Paris\u2014France", ["Paris"], 0, 0, 1),  # nor is an em dash: one token
    ("東京", ["東京"], 1, 1, 1),
    ("東京都", ["東京"], 0, 0, 1),  # one token each; the gold is inside
    ("Paris", "paris", 1, 1, 1),  # one gold answer given as a string
    ("The the the", ["the"], 1, 0, 1),  # both normalise to "": equal and contained, but no token in common
]


def test_the_table_has_at_least_thirty_pairs():
    assert len(HAND_TABLE) >= 30


@pytest.mark.parametrize(("prediction", "golds", "em", "f1", "cover_em"), HAND_TABLE)
def test_scores_match_the_hand_computed_table(prediction, golds, em, f1, cover_em):
    assert rule_scores(prediction, golds) == {"em": em, "f1": pytest.approx(f1), "cover_em": cover_em}


@pytest.mark.parametrize(("prediction", "golds", "em", "f1", "cover_em"), [row for row in HAND_TABLE if row[0]])
def test_the_reward_s_em_is_the_same_function(prediction, golds, em, f1, cover_em):
    """qa_em_format.py (the reward) scores EM with the package's normalisation, unchanged."""
    assert qa_em_format.em_check(prediction, golds) is bool(em)


def test_scores_are_named_in_report_order():
    assert list(rule_scores("Paris", ["Paris"])) == ["em", "f1", "cover_em"] == list(ANSWER_SCORES.names())


def test_no_gold_answer_scores_0_on_each():
    assert rule_scores("Paris", []) == {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
