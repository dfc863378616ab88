"""XML mode (Search-R1's tags) on every model family, thinking on and off: the prompt as the family's template renders
it with slime's --apply-chat-template-kwargs (or the sample's own), the family's end-of-turn token and EOS set as stop
ids, the trajectory token-exact (support/fidelity.py), the end-token abort, --partial-rollout resume and the
fully-async path with each family's own end token, and the reward's format rule under each way of thinking.

Every test runs once per case of support/family_cases.py (the checkpoint's real tokenizer and official template,
support/model_tokenizers.py); the engine is the loopback stand-in, its scripted model writing and ending turns in the
family's shape. The partial-rollout and fully-async machinery is the one tests/rollout/test_partial_rollout.py and
test_fully_async.py drive slime with.
"""

import pytest
import test_fully_async
import test_partial_rollout
from test_fully_async import ABORT_STEP, CUT_AFTER, fully_async_rollout_of
from test_partial_rollout import rollout_aborted_mid_generation, run_rollout

from generate_with_search import generate, reward_func
from qa_em_format import FormatWeights, format_problem, score_response
from slime.utils.types import Sample
from slime_search_r1.data import search_r1_prompt
from slime_search_r1.protocols.xml_tags import read_action
from slime_search_r1.scoring.answers import answer_of
from support.episodes import QUESTION, SEARCH_ONLY, info, label, searches
from support.fidelity import assert_faithful, assert_resumed_exactly
from support.loopback import serve_in_thread
from support.slime_rollout import slime_sampling_params
from support.family_cases import CASE_IDS, CASES, PROMPT_THINKS, THINKING_OFF
from support.xml_families import (
    FamilyEngine,
    family_dir,
    family_prompt,
    family_sample,
    family_tokenizer,
    no_action_then_answer,
    search_then_answer,
    thought,
)

WEIGHTS = FormatWeights(format_score=0.2, final_format_score=0.1)  # Search-R1 v0.3's, the settings' defaults
# the fixtures making slime's args for a partial rollout and for fully-async training, as those tests make them
rollout_args = test_partial_rollout.rollout_args
async_args = test_fully_async.async_args
INFORMATION = "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"


@pytest.fixture(params=CASES, ids=CASE_IDS)
def case(request):
    return request.param


@pytest.fixture
def tokenizer(case):
    return family_tokenizer(case)


@pytest.fixture
def tokenizer_dir(case, tokenizer):
    return str(family_dir(case.checkpoint))


@pytest.fixture
def engine(tokenizer, policy, case):
    engine = FamilyEngine(tokenizer, policy, case)
    with serve_in_thread(engine.app) as url:
        engine.url = url
        yield engine


def prompt_ids(tokenizer, case) -> list[int]:
    return tokenizer.encode(family_prompt(tokenizer, case), add_special_tokens=False)


def end_of_turn_id(tokenizer, case) -> int:
    return tokenizer.convert_tokens_to_ids(case.end_of_turn)


async def episode(case, make_args, tokenizer, **fields) -> tuple:
    args = make_args(apply_chat_template_kwargs=dict(case.template_kwargs))
    sample = await generate(args, family_sample(tokenizer, case, **fields), slime_sampling_params(1024))
    return args, sample


# ---- one episode: the prompt, what ends a turn, the trajectory, the reward --------------------------------------


async def test_an_xml_episode_is_token_exact_and_earns_the_full_reward(
    case, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = search_then_answer(case)
    args, sample = await episode(case, make_args, tokenizer)
    assert sample.status == Sample.Status.COMPLETED and searches(sample) == 1
    assert_faithful(sample, engine.calls, tokenizer, prompt_ids(tokenizer, case), canonical_observations=True)
    for call in engine.calls:  # Search-R1's closing tags, the family's end of turn and the tokenizer's EOS
        assert {"</search>", "</answer>"} <= set(call.sampling_params["stop"])
        assert {end_of_turn_id(tokenizer, case), tokenizer.eos_token_id} <= set(call.sampling_params["stop_token_ids"])
    # Qwen3 and later: each </think> the model wrote is the single added token it sampled
    think_end = tokenizer.get_added_vocab().get("</think>")
    if think_end is not None:
        assert sample.tokens[len(prompt_ids(tokenizer, case)) :].count(think_end) == 2
    assert await reward_func(args, sample) == 1.0
    assert info(sample)["reward"]["format_valid"] == 1.0


@pytest.mark.parametrize("where", ["args", "sample"])
@pytest.mark.parametrize("case", [case for case in CASES if case.thought == THINKING_OFF], ids=lambda case: case.id)
async def test_the_template_kwargs_reach_a_messages_prompt(
    case, where, make_args, tokenizer, engine, policy, search_config
):
    """Without --apply-chat-template slime hands over messages: the plugin renders them with slime's
    --apply-chat-template-kwargs and the sample's own on top, as slime's data path renders a string prompt."""
    policy.scripts[QUESTION + "?"] = search_then_answer(case)
    own = dict(case.template_kwargs) if where == "sample" else {}
    args = make_args(apply_chat_template_kwargs={} if own else dict(case.template_kwargs))
    messages = [{"role": "user", "content": search_r1_prompt(QUESTION)}]
    sample = Sample(prompt=messages, label=label("Paris"), apply_chat_template_kwargs=own)
    sample = await generate(args, sample, slime_sampling_params(1024))
    assert engine.calls[0].input_ids == prompt_ids(tokenizer, case)  # the empty thought the kwargs put there
    assert await reward_func(args, sample) == 1.0


# ---- the format rule under each way of thinking -----------------------------------------------------------------


@pytest.mark.parametrize(("answer", "expected"), [("Paris", 1.0), ("Berlin", 0.2)])
def test_the_format_bonus_is_search_r1_s_under_every_family(case, tokenizer, answer, expected):
    first, then = search_then_answer(case, answer)
    response = first + INFORMATION + then
    assert format_problem(family_prompt(tokenizer, case), response) is None
    assert score_response(family_prompt(tokenizer, case), response, ["Paris"], WEIGHTS).score == expected


def test_a_response_in_another_thinking_shape_breaks_the_format(case, tokenizer):
    """A response must fit the thought its prompt left: one the prompt opened is closed first; otherwise the model
    opens its own (the empty thought a thinking-off template writes is the template's, not the model's)."""
    closes_first = "I know it.\n</think>\n\n<answer> Paris </answer>"
    opens_its_own = "<think>\nI know it.\n</think>\n\n<answer> Paris </answer>"
    wrong = opens_its_own if case.thought == PROMPT_THINKS else closes_first
    assert format_problem(family_prompt(tokenizer, case), wrong) is not None
    assert score_response(family_prompt(tokenizer, case), wrong, ["Paris"], WEIGHTS).score == 0.8
    no_thought = score_response(family_prompt(tokenizer, case), "<answer> Paris </answer>", ["Paris"], WEIGHTS)
    if case.thought == PROMPT_THINKS:  # all of it inside the thought the prompt opened: no answer was given
        assert (no_thought.answer, no_thought.format_valid, no_thought.score) == (None, False, 0.0)
    else:
        assert (no_thought.answer, no_thought.format_valid, no_thought.score) == ("Paris", False, 0.8)


# ---- a thought that quotes the tags ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "quote",
    ["call a search engine by <search> query </search>", "the answer goes in <answer> Beijing </answer>"],
    ids=["search", "answer"],
)
async def test_tags_inside_an_open_thought_are_not_actions(
    case, quote, make_args, tokenizer, engine, policy, retriever, search_config
):
    """The engine stops at a closing tag wherever it comes: a turn cut inside a thought that quotes a tag is no
    action (Search-R1's reading would search for "query", or end on the answer "Beijing"). The model is shown the
    invalid-action message and goes on; the tags inside its thought break Search-R1's format."""
    opening = "" if case.thought == PROMPT_THINKS else "<think>\n"
    policy.scripts[QUESTION + "?"] = [
        f"{opening}The instructions say to {quote}",
        "So I look it up.\n</think>\n\n<search> capital of France </search>",
        thought(case, "The documents say it.", first=False) + "<answer> Paris </answer>",
    ]
    args, sample = await episode(case, make_args, tokenizer)
    assert sample.status == Sample.Status.COMPLETED
    assert (info(sample)["invalid_actions"], info(sample)["turns"]) == (1, 3)
    assert retriever.queries == ["capital of France"]
    assert_faithful(sample, engine.calls, tokenizer, prompt_ids(tokenizer, case), canonical_observations=True)
    assert await reward_func(args, sample) == pytest.approx(0.8)  # Paris, in a broken format


@pytest.mark.parametrize(
    ("text", "in_thought", "action"),
    [
        ("<think>\nI could use <search> query </search>", False, None),  # a quote in an open thought
        ("I could use <search> query </search>", True, None),  # the prompt opened the thought
        ("Done.\n</think>\n\n<search> capital </search>", True, "capital"),
        ("<think>a</think>\n<search> capital </search>", False, "capital"),
        ("the rest of it.</think>\n<search> capital </search>", False, "capital"),  # first marker </think>
        ("<think>a <search> b</think> c </search>", False, None),  # Search-R1's reading: a search for "b</think> c"
        ("<think>a <answer> Rome </answer>", False, None),
        ("<think>a</think>\n<answer> Paris </answer>", False, "answer"),
        ("<search> capital </search>", False, "capital"),
    ],
)
def test_a_tag_is_an_action_only_outside_a_thought(text, in_thought, action):
    read = read_action(text, SEARCH_ONLY, 0, in_thought)
    got = "answer" if read.final else read.calls[0].arguments["query"].strip() if read.calls else None
    assert (got, read.invalid) == (action, action is None)


def test_the_recorded_answer_of_a_thinking_prompt_is_never_read_inside_its_thought():
    """What evaluate.py and the viewer show is what reward_func scored: nothing before the prompt's thought closes."""
    prompt = "<|im_start|>user\nQuestion: capital of France?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert answer_of(Sample(prompt=prompt, response="Maybe <answer> Lyon </answer>")) is None
    closed = Sample(prompt=prompt, response="Maybe Lyon.\n</think>\n\n<answer> Paris </answer>")
    assert answer_of(closed) == "Paris"


# ---- aborts: the end token, --partial-rollout, fully-async --------------------------------------------------------


async def test_an_episode_aborted_mid_turn_resumes_token_exactly(
    case, rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = search_then_answer(case)
    args = rollout_args("generate", apply_chat_template_kwargs=dict(case.template_kwargs))
    baseline = (await run_rollout(args, [[family_sample(tokenizer, case, index=0, group_index=0)]]))[0][0]
    calls_before = len(engine.calls)
    fresh = [[family_sample(tokenizer, case, index=0, group_index=0)]]
    buffered = await rollout_aborted_mid_generation(engine, args, fresh, 2, 7, 0)
    assert buffered[0][0].status == Sample.Status.ABORTED
    resumed = (await run_rollout(args, buffered))[0][0]
    assert_resumed_exactly(resumed, baseline)
    assert_faithful(resumed, engine.calls[calls_before:], tokenizer, prompt_ids(tokenizer, case))
    assert info(resumed)["resumes"] == 1 and resumed.reward == 1.0


async def test_an_abort_whose_one_more_step_samples_the_end_token_ends_the_turn_there(
    case, rollout_args, tokenizer, engine, policy, retriever
):
    """A turn with no tag ends on the family's end-of-turn token. slime aborts one token before it: the abort's one
    more step samples it, and the turn ends there as the engine would have ended it, never continued past it."""
    policy.scripts[QUESTION + "?"] = no_action_then_answer(case)
    args = rollout_args("generate", apply_chat_template_kwargs=dict(case.template_kwargs))
    calls_before = len(engine.calls)
    baseline = (await run_rollout(args, [[family_sample(tokenizer, case, index=0, group_index=0)]]))[0][0]
    uninterrupted = engine.calls[calls_before:]
    assert uninterrupted[0].output_ids[-1] == end_of_turn_id(tokenizer, case)
    calls_before = len(engine.calls)
    held = len(uninterrupted[0].output_ids) - 1
    fresh = [[family_sample(tokenizer, case, index=0, group_index=0)]]
    ended = (await rollout_aborted_mid_generation(engine, args, fresh, 1, held, 0))[0][0]
    assert engine.calls[calls_before].finish["type"] == "abort"
    assert info(ended)["engine_aborts"] == info(ended)["aborts_after_turn_end"] == 1
    done = (await run_rollout(args, [[ended]]))[0][0]
    assert_resumed_exactly(done, baseline)
    assert [len(call.input_ids) for call in engine.calls[calls_before:]] == [len(c.input_ids) for c in uninterrupted]


async def test_a_turn_cut_by_a_weight_update_in_fully_async_training_resumes_token_exactly(
    case, async_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = search_then_answer(case)

    def args_of_the_case():
        args = async_args("generate")
        args.apply_chat_template_kwargs = dict(case.template_kwargs)
        return args

    baseline = (await fully_async_rollout_of(args_of_the_case(), [family_sample(tokenizer, case)]))[0][0]
    args = args_of_the_case()
    calls_before = len(engine.calls)
    pause = engine.pause_at(calls_before + 2, CUT_AFTER)  # the second turn, CUT_AFTER tokens in
    sample = (await fully_async_rollout_of(args, [family_sample(tokenizer, case)]))[0][0]
    assert pause.aborted
    assert_resumed_exactly(sample, baseline)
    calls = engine.calls[calls_before:]
    cut = len(calls[1].input_ids) - len(prompt_ids(tokenizer, case)) + CUT_AFTER + ABORT_STEP
    assert (info(sample)["resumes"], info(sample)["resumed_at"]) == (1, [cut])
    assert_faithful(sample, calls, tokenizer, prompt_ids(tokenizer, case))
    assert sample.reward == 1.0
