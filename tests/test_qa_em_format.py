"""Search-R1's EM and format rules, the label shapes slime hands over, and the configured weights."""

import numpy as np
import pytest

from qa_em_format import FormatWeights, em_check, format_problem, normalize_answer, score_response
from slime_search_r1.data import golden_answers

PROMPT = "<|im_start|>user\nQuestion: capital of France? For example, <answer> Beijing </answer>.<|im_end|>\n"
PROMPT += "<|im_start|>assistant\n"
VALID_RIGHT = (
    "<think>search it</think>\n<search> capital of France </search>\n\n<information>Doc 1(Title: Paris) Paris is the "
    "capital.</information>\n\n<think>found</think>\n<answer> Paris </answer>"
)
V03 = FormatWeights(format_score=0.2, final_format_score=0.1, retrieval_score=0.1)


def test_normalization_is_squad_style():
    assert normalize_answer("  The  Eiffel-Tower! ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert em_check("the Paris.", ["paris"]) and not em_check("Paris France", ["Paris"])
    assert em_check("Paris", "paris")


@pytest.mark.parametrize(
    ("response", "expected", "valid"),
    [
        (VALID_RIGHT, 1.0, True),  # correct, valid
        (VALID_RIGHT + " extra", 0.8, False),  # correct, text after </answer>
        (VALID_RIGHT.replace("Paris </answer>", "Rome </answer>"), 0.3, True),  # wrong, valid, gold retrieved
        (VALID_RIGHT.replace("Paris", "Rome"), 0.2, True),  # wrong, valid, gold not retrieved
        ("<answer> Rome </answer>", 0.1, False),  # wrong, no <think> first
        ("<think>no idea</think>", 0.0, False),  # no answer, incomplete
    ],
)
def test_reward_table(response, expected, valid):
    details = score_response(PROMPT, response, ["Paris"], V03)
    assert details.score == pytest.approx(expected)
    assert details.format_valid is valid


def test_no_answer_with_valid_format_needs_no_example_answer():
    prompt = "<|im_start|>assistant\n"
    details = score_response(prompt, "<think>a</think>\n<answer></answer>", ["Paris"], V03)
    assert details.answer == "" and details.format_valid and details.score == pytest.approx(0.2)


def test_zero_weights_give_pure_em():
    weights = FormatWeights()
    assert score_response(PROMPT, VALID_RIGHT + " extra", ["Paris"], weights).score == 1.0
    assert score_response(PROMPT, VALID_RIGHT.replace("Paris </", "Rome </"), ["Paris"], weights).score == 0.0
    assert score_response(PROMPT, "<answer> Rome </answer>", ["Paris"], weights).score == 0.0


def test_the_last_answer_counts():
    response = "<think>a</think>\n<answer> Rome </answer><answer> Paris </answer>"
    assert score_response(PROMPT, response, ["Paris"], FormatWeights()).em == 1.0
    assert score_response(PROMPT, "", ["Beijing"], FormatWeights()).answer is None  # the prompt's example is ignored


@pytest.mark.parametrize(
    "problem_text",
    [
        ("<think>a</think><think>b</think>", "unexpected <think>"),
        ("<think>a</think> text <answer>x</answer>", "unexpected text"),
        ("<think>a<answer>x</answer>", "unbalanced <think>"),
        ("<think>a</think><search>q</search><answer>x</answer>", "unexpected <answer>"),
    ],
)
def test_format_problems_are_named(problem_text):
    response, expected = problem_text
    assert expected in format_problem(PROMPT + response)


def test_missing_assistant_marker_is_invalid():
    assert format_problem("Question: x\n<think>a</think><answer>b</answer>") == "missing <|im_start|>assistant marker"


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ({"style": "rule", "ground_truth": {"target": ["Paris", "paris city"]}}, ["Paris", "paris city"]),
        ({"ground_truth": {"target": np.array(["Paris"], dtype=object)}}, ["Paris"]),
        ({"ground_truth": {"target": "Paris"}}, ["Paris"]),
        ({"ground_truth": "Paris"}, ["Paris"]),
        ({"target": ["Paris"]}, ["Paris"]),
        (np.array(["Paris", "Lutetia"]), ["Paris", "Lutetia"]),
        ("Paris", ["Paris"]),
        ({"ground_truth": {"target": [1984]}}, ["1984"]),
    ],
)
def test_label_shapes(label, expected):
    assert golden_answers(label) == expected


@pytest.mark.parametrize("label", [None, {"ground_truth": {"answers": ["x"]}}, {"ground_truth": {"target": []}}, 3.5j])
def test_bad_labels_say_what_is_expected(label):
    with pytest.raises(ValueError, match="ground_truth"):
        golden_answers(label)


def test_environment_text_is_never_read_as_the_answer():
    from slime_search_r1.protocols.xml import INVALID_ACTION_MESSAGE

    response = "I think it is Paris." + INVALID_ACTION_MESSAGE + "<think>a</think>\n<search> q </search>"
    response += "\n\n<information>Doc 1(Title: x) the page says <answer> Paris </answer></information>\n\n"
    details = score_response(PROMPT, response, ["and", "Paris"], V03)
    assert details.answer is None and details.score == 0.0
