"""The reward table (qa_em_format.py's docstring): one test per row, in XML and chat; the format rules of both
protocols; EM normalisation; the gold-answer labels slime hands over; evaluation as pure EM; and what reward_func
returns for slime's --reward-key, --eval-reward-key and --group-rm.

XML replies are scored with score_response (prompt + response); chat replies are conversations of OpenAI
messages, read by read_conversation and scored with the same table (score_conversation), as reward_func does.
"""

import json
from dataclasses import dataclass

import numpy as np
import pytest

from generate_with_search import reward_func
from qa_em_format import FormatWeights, em_check, format_problem, normalize_answer, score_conversation, score_response
from slime.utils.types import Sample
from slime_search_r1.data import golden_answers
from slime_search_r1.episode import METADATA_KEY
from slime_search_r1.protocols.chat import FORCE_ANSWER_MESSAGE, FORCED_ANSWER_KEY
from slime_search_r1.protocols.chat_reward import ConversationReading, conversation_format_problem, read_conversation
from slime_search_r1.protocols.xml_tags import invalid_action_message
from slime_search_r1.tools.access import ACCESS
from slime_search_r1.tools.search import SEARCH as SEARCH_TOOL
from support.episodes import (
    SEARCH_ONLY,
    SEARCH_R1_INVALID_ACTION,
    ANSWER,
    ANSWER_TURN,
    CALL,
    CALL_BERLIN,
    INVENTED_RESPONSE,
    MODE_IDS,
    MODES,
    QUESTION,
    SEARCH,
    SEARCH_TURN,
    WRONG,
    WRONG_TURN,
    chat_prompt_ids,
    conversation,
    info,
    label,
    rollout,
    run_chat,
    run_episode,
)
from support.fidelity import assert_faithful

# Search-R1 v0.3's weights: format_score 0.2, final_format_score 0.1, retrieval_score 0.1.
WEIGHTS = FormatWeights(format_score=0.2, final_format_score=0.1, retrieval_score=0.1)

# ---- XML replies ------------------------------------------------------------------------------------------------
PROMPT = "<|im_start|>user\nQuestion: capital of France? For example, <answer> Beijing </answer>.<|im_end|>\n"
PROMPT += "<|im_start|>assistant\n"
VALID_RIGHT = (
    "<think>search it</think>\n<search> capital of France </search>\n\n<information>Doc 1(Title: Paris) Paris is the "
    "capital.</information>\n\n<think>found</think>\n<answer> Paris </answer>"
)


@dataclass(frozen=True)
class Xml:
    """An XML-mode reply: the response, scored after its prompt."""

    response: str
    prompt: str = PROMPT


# ---- chat replies -----------------------------------------------------------------------------------------------
def call(query, name="search", call_id="call_0"):
    arguments = json.dumps({"query": query})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content="", *calls):
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def tool(content):
    return {"role": "tool", "tool_call_id": "call_0", "name": "search", "content": content}


GOOD = [
    assistant("<think>look</think>", call("capital of France")),
    tool("Doc 1(Title: Paris) Paris is..."),
    assistant("<answer> Paris </answer>"),
]


def score(reply, golds, weights=WEIGHTS):
    """What reward_func does with a reply of either protocol."""
    if isinstance(reply, Xml):
        return score_response(reply.prompt, reply.response, golds, weights)
    return score_conversation(reply, golds, weights)


def xml_and_chat(xml_reply, chat_reply, golds=("Paris",), chat_golds=None):
    return [
        pytest.param(xml_reply, list(golds), id="xml"),
        pytest.param(chat_reply, list(chat_golds or golds), id="chat"),
    ]


# ---- the table, one row per test --------------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "golds"), xml_and_chat(Xml(VALID_RIGHT), GOOD))
def test_a_correct_answer_in_a_valid_format_scores_1(reply, golds):
    details = score(reply, golds)
    assert details.score == 1.0
    assert details.format_valid is True


@pytest.mark.parametrize(
    ("reply", "golds"), xml_and_chat(Xml(VALID_RIGHT + " extra"), [assistant("<answer> Paris </answer> extra")])
)
def test_a_correct_answer_in_an_invalid_format_scores_1_minus_format_score(reply, golds):
    details = score(reply, golds)
    assert details.score == pytest.approx(0.8)
    assert details.format_valid is False


@pytest.mark.parametrize(
    ("reply", "golds"),
    xml_and_chat(
        Xml(VALID_RIGHT.replace("Paris", "Rome")),
        [*GOOD[:2], assistant("<answer> Rome </answer>")],
        chat_golds=["Lyon"],  # the chat conversation retrieved "Paris": a gold it does not hold
    ),
)
def test_a_wrong_answer_in_a_valid_format_scores_format_score(reply, golds):
    details = score(reply, golds)
    assert details.score == pytest.approx(0.2)
    assert details.format_valid is True


@pytest.mark.parametrize(
    ("reply", "golds"),
    xml_and_chat(
        Xml(VALID_RIGHT.replace("Paris </answer>", "Rome </answer>")),
        [*GOOD[:2], assistant("<answer> Rome </answer>")],
    ),
)
def test_a_wrong_answer_in_a_valid_format_adds_retrieval_score_when_a_gold_answer_was_retrieved(reply, golds):
    details = score(reply, golds)
    assert details.score == pytest.approx(0.3)
    assert details.format_valid is True


@pytest.mark.parametrize(
    ("reply", "golds"),
    xml_and_chat(
        Xml(VALID_RIGHT.replace("Paris </answer>", "Rome </answer>") + " extra"),
        [*GOOD[:2], assistant("<answer> Rome </answer> extra")],
    ),
)
def test_a_retrieved_gold_answer_is_no_retrieval_hit_without_a_valid_format(reply, golds):
    # the information and the tool message hold "Paris"; the text after </answer> breaks the format
    details = score(reply, golds)
    assert details.format_valid is False
    assert details.retrieval_hit is False  # what the retrieval_hit metric logs: the bonus it would have paid
    assert details.score == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("reply", "golds"), xml_and_chat(Xml("<answer> Rome </answer>"), [assistant("<answer> Rome </answer> x")])
)
def test_a_wrong_answer_in_an_invalid_format_scores_final_format_score(reply, golds):
    details = score(reply, golds)  # XML: no <think> first; chat: text after </answer>
    assert details.score == pytest.approx(0.1)
    assert details.format_valid is False


@pytest.mark.parametrize(
    ("reply", "golds"),
    xml_and_chat(
        Xml("<think>a</think>\n<answer></answer>", prompt="<|im_start|>assistant\n"), [assistant("<answer></answer>")]
    ),
)
def test_an_empty_answer_in_a_valid_format_scores_format_score(reply, golds):
    details = score(reply, golds)  # the XML prompt holds no example answer: the response alone is read
    assert details.answer == ""
    assert details.format_valid is True
    assert details.score == pytest.approx(0.2)


@pytest.mark.parametrize(("reply", "golds"), xml_and_chat(Xml("<think>no idea</think>"), [assistant("I give up")]))
def test_no_answer_in_an_invalid_format_scores_0(reply, golds):
    details = score(reply, golds)
    assert details.score == 0.0
    assert details.format_valid is False


# ---- the weights ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (VALID_RIGHT + " extra", 1.0),
        (VALID_RIGHT.replace("Paris </", "Rome </"), 0.0),
        ("<answer> Rome </answer>", 0.0),
    ],
    ids=["correct, invalid format", "wrong, valid format, gold retrieved", "wrong, invalid format"],
)
def test_zero_weights_give_pure_em(response, expected):
    assert score_response(PROMPT, response, ["Paris"], FormatWeights()).score == expected


async def test_the_configured_format_score_is_the_wrong_answer_s_reward(
    make_args, tokenizer, engine, policy, search_config, monkeypatch
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, WRONG_TURN]
    monkeypatch.setitem(search_config, "format_score", 0.3)
    args, sample, _ = await rollout(make_args, tokenizer)
    assert await reward_func(args, sample) == pytest.approx(0.3)
    monkeypatch.setitem(search_config, "format_score", 0.0)
    assert await reward_func(args, sample) == 0.0


# ---- the XML format rule ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>a</think><think>b</think>", "unexpected <think>"),
        ("<think>a</think> text <answer>x</answer>", "unexpected text"),
        ("<think>a<answer>x</answer>", "unbalanced <think>"),
        ("<think>a</think><search>q</search><answer>x</answer>", "unexpected <answer>"),
    ],
)
def test_xml_format_problems_are_named(response, expected):
    assert expected in format_problem(PROMPT, response)


def test_unexpected_xml_text_is_quoted_up_to_40_characters():
    text = "the answer is surely somewhere in these documents"  # 49 characters
    response = f"<think>a</think> {text} <answer>x</answer>"
    assert format_problem(PROMPT, response) == f"unexpected text {text[:40]!r} in state after_think"


def test_an_xml_response_without_the_assistant_marker_is_invalid():
    assert format_problem("Question: x\n", "<think>a</think><answer>b</answer>") == (
        "missing assistant marker (<|im_start|>assistant or <|start_header_id|>assistant<|end_header_id|>)"
    )


def test_the_last_xml_answer_counts():
    response = "<think>a</think>\n<answer> Rome </answer><answer> Paris </answer>"
    assert score_response(PROMPT, response, ["Paris"], FormatWeights()).em == 1.0


def test_the_prompt_s_example_answer_is_never_read_as_the_answer():
    assert score_response(PROMPT, "", ["Beijing"], FormatWeights()).answer is None


def test_environment_text_is_never_read_as_the_answer():
    response = "I think it is Paris." + SEARCH_R1_INVALID_ACTION + "<think>a</think>\n<search> q </search>"
    response += "\n\n<information>Doc 1(Title: x) the page says <answer> Paris </answer></information>\n\n"
    details = score_response(PROMPT, response, ["and", "Paris"], WEIGHTS)
    assert details.answer is None
    assert details.score == 0.0


@pytest.mark.parametrize(
    "response",
    [
        "<think>a</think>\n<answer> Paris" + SEARCH_R1_INVALID_ACTION + "</answer>",
        "<think>a</think>\n<answer> Paris <information>Doc 1(Title: Lyon) Lyon</information></answer>",
    ],
    ids=["invalid-action message", "information"],
)
def test_environment_text_inside_an_answer_is_not_part_of_it(response):
    assert score_response(PROMPT, response, ["Paris"], FormatWeights()).answer == "Paris"


# ---- tools beyond search (SEARCH_R1_TOOLS=search,access) -----------------------------------------------------------
SEARCH_AND_ACCESS = {"search": SEARCH_TOOL, "access": ACCESS}
PAGE = "https://en.wikipedia.org/wiki/Paris"
XML_ACCESS = (
    f"<think>read it</think>\n<access> {PAGE} </access>\n\n<information>Paris is the capital of France."
    "</information>\n\n<think>found</think>\n<answer> Paris </answer>"
)
CHAT_ACCESS = [
    assistant(
        "<think>read it</think>", {**call(""), "function": {"name": "access", "arguments": json.dumps({"url": PAGE})}}
    ),
    tool("Paris is the capital of France."),
    assistant("<answer> Paris </answer>"),
]


@pytest.mark.parametrize(("reply", "golds"), xml_and_chat(Xml(XML_ACCESS), CHAT_ACCESS))
def test_a_call_to_an_enabled_tool_beyond_search_keeps_the_format_valid(reply, golds):
    if isinstance(reply, Xml):
        details = score_response(reply.prompt, reply.response, golds, WEIGHTS, SEARCH_AND_ACCESS)
    else:
        details = score_conversation(reply, golds, WEIGHTS, SEARCH_AND_ACCESS)
    assert (details.format_valid, details.answer, details.score) == (True, "Paris", 1.0)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_reward_func_reads_a_call_to_every_enabled_tool(mode, make_args, search_config):
    search_config.update(tools=["search", "access"], format_score=0.2)
    if mode == "generate":
        sample = Sample(prompt=PROMPT, response=XML_ACCESS, label=label("Paris"), metadata={METADATA_KEY: {}})
    else:
        messages = [{"role": "user", "content": "Question: capital of France?"}]
        sample = Sample(prompt=messages, label=label("Paris"), metadata={METADATA_KEY: {"conversation": CHAT_ACCESS}})
    assert await reward_func(make_args(), sample) == 1.0  # a valid format: access is enabled


def test_the_invalid_action_message_naming_every_enabled_tool_is_never_read_as_the_answer():
    message = invalid_action_message(SEARCH_AND_ACCESS.values())
    assert "<answer> and </answer>" in message
    response = "I think it is Paris." + message + f"<think>a</think>\n<access> {PAGE} </access>"
    details = score_response(PROMPT, response, ["and", "Paris"], WEIGHTS, SEARCH_AND_ACCESS)
    assert details.answer is None
    assert details.score == 0.0


async def test_an_invalid_action_does_not_pay_better_than_searching(
    make_args, tokenizer, engine, policy, search_config
):
    search_config["max_turns"] = 2
    policy.scripts[QUESTION + "?"] = ["no tags at all", SEARCH_TURN]
    args, invalid, _ = await rollout(make_args, tokenizer)
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, SEARCH_TURN]
    _, searching, _ = await rollout(make_args, tokenizer)
    assert await reward_func(args, invalid) == 0.0
    assert await reward_func(args, searching) == 0.0


# ---- the chat format rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conversation",
    [GOOD, [assistant("<answer> Paris </answer>")]],
    ids=["search then answer", "answer at once"],
)
def test_a_chat_conversation_that_ends_in_one_answer_after_well_formed_calls_is_valid(conversation):
    assert conversation_format_problem(conversation, SEARCH_ONLY) is None


@pytest.mark.parametrize(
    ("conversation", "problem"),
    [
        ([assistant("no answer")], "0 <answer> blocks in the final turn"),
        ([assistant("<answer>a</answer><answer>b</answer>")], "2 <answer> blocks in the final turn"),
        ([assistant("<answer> Paris </answer> and more")], "text after </answer>"),
        ([assistant("<answer> Paris </answer> and more </answer>")], "text after </answer>"),  # a stray closing tag
        ([assistant("x", call("q")), tool("r")], "the last turn is a tool call"),
        ([assistant("x", call("")), tool("Error"), assistant("<answer>a</answer>")], "malformed tool call"),
        (
            [assistant("x", call("q", name="lookup")), tool("Error"), assistant("<answer>a</answer>")],
            "malformed tool call",
        ),
        (
            [assistant("hm"), {"role": "user", "content": "hint"}, assistant("<answer>a</answer>")],
            "a retry hint was needed",
        ),
        ([assistant("hm"), assistant("<answer>a</answer>")], "an assistant turn before the last made no tool call"),
        (
            [assistant("<answer>a</answer>", call("q")), tool("r"), assistant("<answer>a</answer>")],
            "<answer> before the final turn",
        ),
        ([assistant("x", call("q")), assistant("<answer>a</answer>")], "a tool call without its tool message"),
        ([assistant('<tool_call>{"name": </tool_call>')], "unparsable tool call"),
        (
            [
                {**assistant("x", call("q")), "text_after_tool_calls": "<tool_response>r</tool_response>"},
                tool("r"),
                assistant("<answer>a</answer>"),
            ],
            "text after a tool call",
        ),
        ([], "no assistant turn"),
    ],
)
def test_chat_format_problems_are_named(conversation, problem):
    assert conversation_format_problem(conversation, SEARCH_ONLY) == problem


def test_the_environment_s_forced_answer_instruction_is_no_retry_hint():
    # SEARCH_R1_FORCE_ANSWER=inject records its user message with FORCED_ANSWER_KEY: the format stays valid
    forced = {"role": "user", "content": FORCE_ANSWER_MESSAGE, FORCED_ANSWER_KEY: True}
    conversation = [*GOOD[:2], forced, assistant("<answer> Paris </answer>")]
    assert conversation_format_problem(conversation, SEARCH_ONLY) is None
    assert score(conversation, ["Paris"]).score == 1.0


@pytest.mark.parametrize(
    ("conversation", "expected"),
    [
        ([], ConversationReading(None, False, [])),
        ([tool("r")], ConversationReading(None, False, ["r"])),
        # the final message calls a tool: its <answer> is no answer (the episode ended before a reply)
        (
            [assistant("<answer> Paris </answer>", call("q")), tool("Doc 1")],
            ConversationReading(None, False, ["Doc 1"]),
        ),
        # a tool message without content retrieved nothing
        (
            [assistant("x", call("q")), tool(None), assistant("<answer> Paris </answer>")],
            ConversationReading("Paris", True, [""]),
        ),
    ],
    ids=["empty", "no assistant turn", "final turn calls a tool", "tool message without content"],
)
def test_what_a_conversation_gives_the_reward(conversation, expected):
    assert read_conversation(conversation, SEARCH_ONLY) == expected


@pytest.mark.parametrize("after", ["\n", "\n\n", " \t\n"], ids=["newline", "blank line", "spaces"])
def test_whitespace_after_the_final_chat_answer_keeps_the_format_valid(after):
    # a model's final message often ends in a newline: only text after </answer> costs the format bonus
    conversation = [*GOOD[:2], assistant("<think>found</think>\n<answer> Paris </answer>" + after)]
    assert conversation_format_problem(conversation, SEARCH_ONLY) is None
    details = score(conversation, ["Paris"])
    assert (details.format_valid, details.score) == (True, 1.0)


def test_the_last_answer_of_the_final_chat_message_is_scored_and_several_answers_are_invalid():
    several = [assistant("<answer> Rome </answer> no wait <answer> Paris </answer>")]
    details = score(several, ["Paris"])
    assert details.answer == "Paris"
    assert details.em == 1.0
    assert not details.format_valid


@pytest.mark.parametrize(
    ("first_turn", "after_call", "reward"),
    [
        (INVENTED_RESPONSE, "<tool_response>\nParis is the capital of France.\n</tool_response>", 0.8),
        (CALL + "\nI am sure it is Paris.", "I am sure it is Paris.", 0.8),
        (CALL + "\n<answer> Paris </answer>", "<answer> Paris </answer>", 0.8),
        (CALL + "\n" + CALL_BERLIN + "\n", None, 1.0),  # two well-formed calls: valid
    ],
    ids=["invented tool response", "free text", "answer after the call", "two calls"],
)
async def test_only_whitespace_and_further_calls_may_follow_a_tool_call(
    make_args, tokenizer, engine, policy, retriever, search_config, first_turn, after_call, reward
):
    policy.scripts[QUESTION + "?"] = [first_turn, ANSWER["chat"]]
    args = make_args()
    sample = await run_chat(args, search_config, "chat")
    first = conversation(sample)[0]
    assert first.get("text_after_tool_calls") == after_call  # the record keeps what the model wrote
    assert await reward_func(args, sample) == pytest.approx(reward)
    prompt_ids = chat_prompt_ids(tokenizer, sample.prompt)
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids, canonical_observations=True)


# ---- EM normalisation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [("  The  Eiffel-Tower! ", "eiffeltower"), ("An apple, a day", "apple day")],
    ids=["case, punctuation, spaces", "articles"],
)
def test_answers_are_normalized_squad_style(text, normalized):
    assert normalize_answer(text) == normalized


def test_em_ignores_articles_case_and_punctuation():
    assert em_check("the Paris.", ["paris"])


def test_em_needs_the_whole_answer():
    assert not em_check("Paris France", ["Paris"])


def test_em_takes_a_single_gold_answer_as_a_string():
    assert em_check("Paris", "paris")


# ---- the gold answers in the label slime hands over -------------------------------------------------------------


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
def test_every_label_shape_slime_hands_over_gives_the_gold_answers(label, expected):
    assert golden_answers(label) == expected


@pytest.mark.parametrize("label", [None, {"ground_truth": {"answers": ["x"]}}, {"ground_truth": {"target": []}}, 3.5j])
def test_bad_labels_say_what_is_expected(label):
    with pytest.raises(ValueError, match="ground_truth"):
        golden_answers(label)


# ---- reward_func on real episodes: training earns the format bonus, evaluation is pure EM -----------------------


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_a_wrong_answer_in_a_valid_format_earns_the_format_bonus_in_training(
    mode, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], WRONG[mode]]
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    assert episode.sample.status == Sample.Status.COMPLETED
    assert await reward_func(episode.args, episode.sample) == pytest.approx(0.2)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_evaluation_is_pure_em_so_a_wrong_answer_in_a_valid_format_earns_nothing(
    mode, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], WRONG[mode]]
    episode = await run_episode(mode, make_args, tokenizer, search_config, evaluation=True)
    assert info(episode.sample)["evaluation"] is True
    assert await reward_func(episode.args, episode.sample) == 0.0


# ---- what reward_func returns to slime --------------------------------------------------------------------------


async def test_the_reward_key_returns_the_details(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args, sample, _ = await rollout(make_args, tokenizer, reward_key="score")
    reward = await reward_func(args, sample)
    assert reward == {"score": 1.0, "em": 1.0, "format_valid": 1.0, "retrieval_hit": 1.0}


async def test_the_reward_key_also_keys_evaluation_rewards_as_slime_copies_it(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, WRONG_TURN]
    args, sample, _ = await rollout(make_args, tokenizer, reward_key="score", evaluation=True)
    assert args.eval_reward_key == "score"  # slime's argument parsing copies --reward-key into it
    reward = await reward_func(args, sample)
    assert reward[args.eval_reward_key] == 0.0  # what slime's evaluation logs: pure EM, no format bonus


async def test_the_eval_reward_key_alone_keeps_training_rewards_scalar(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args, sample, _ = await rollout(make_args, tokenizer, eval_reward_key="em")
    assert await reward_func(args, sample) == 1.0
    args, sample, _ = await rollout(make_args, tokenizer, eval_reward_key="em", evaluation=True)
    assert (await reward_func(args, sample))["em"] == 1.0


async def test_a_group_reward_returns_one_reward_per_sample(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args, right, _ = await rollout(make_args, tokenizer)
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, WRONG_TURN]
    _, wrong, _ = await rollout(make_args, tokenizer)
    assert await reward_func(args, [right, wrong]) == [1.0, pytest.approx(0.2)]
