"""Rewards over F1, cover EM and an LLM judge (SEARCH_R1_REWARD): the reward table over an answer score s
(qa_em_format.py's docstring), reward_func on real episodes, a judge that is down or answers nonsense (the sample is
marked, kept out of its group's advantages, counted in the logs), the settings refused at launch, and both rewards
through slime's own reward path (generate_and_rm_group -> async_rm / batched_async_rm -> reward_func, --reward-key,
--group-rm) and its reward post-processing with the plugin's hook.

The judge is the loopback stand-in of an OpenAI-compatible endpoint (support/fake_judge.py, the judge_server
fixture): it says "correct" when the answer contains a reference answer.
"""

import asyncio
import functools
import logging
import re
from argparse import Namespace
import types

import pytest
from transformers import AutoTokenizer

from generate_with_search import post_process_rewards, reward_func
from qa_em_format import FormatWeights, read_response, score_reading
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.episode import METADATA_KEY
from slime_search_r1.launch.__main__ import main as launch
from slime_search_r1.launch.checks import PLUGIN
from slime_search_r1.registry import reward_names
from slime_search_r1.slime_flags import check_slime_args
from slime_search_r1.scoring import rewards
from slime_search_r1.scoring.judge import JudgeConfig
from slime_search_r1.scoring.rewards import grade, judge_client, question_of
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.settings.table import SETTINGS
from support.episodes import MODE_IDS, MODES, QUESTION, SEARCH, info, label, run_episode
from support.fake_judge import default_rule, prediction_of
from support.fake_sglang import question_of as question_of_context
from support.slime_group_math import _method_source, slime_post_process_rewards
from support.slime_rollout import chat_prompt, log_rollout_data
from support.tracking import record_tracking

WEIGHTS = FormatWeights(format_score=0.2, final_format_score=0.1, retrieval_score=0.1)  # Search-R1 v0.3's
PROMPT = "<|im_start|>user\nQuestion: capital of France?<|im_end|>\n<|im_start|>assistant\n"
SEARCHED = (
    "<think>look</think>\n<search> q </search>\n\n<information>Doc 1(Title: Paris) Paris is...</information>\n\n"
)
NEAR = "<think>Found it.</think>\n<answer> Paris France </answer>"  # nearly right, in either protocol
F1_PARIS_FRANCE = 2 * 0.5 * 1.0 / 1.5  # precision 1/2, recall 1/1


@pytest.fixture
def judged(search_config, judge_server, monkeypatch):
    """SEARCH_R1_REWARD=judge against the loopback judge, two attempts per answer (JudgeConfig's 4, halved to keep
    the failing cases short)."""
    search_config.update(reward="judge")
    search_config["judge"] = {**search_config["judge"], "url": judge_server.url, "model": "judge-7b"}
    monkeypatch.setattr(rewards, "JudgeConfig", functools.partial(JudgeConfig, attempts=2))
    return judge_server


# ---- the table over s -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "s", "expected"),
    [
        (SEARCHED + "<think>x</think>\n<answer> Rome </answer>", 0.5, 0.5 * 1.0 + 0.5 * (0.2 + 0.1)),  # valid, hit
        ("<think>x</think>\n<answer> Rome </answer>", 0.5, 0.5 * 1.0 + 0.5 * 0.2),  # valid, nothing retrieved
        ("<answer> Rome </answer>", 0.25, 0.25 * (1.0 - 0.2) + 0.75 * 0.1),  # invalid format
        ("<answer> Rome </answer>", 1.0, 0.8),  # s = 1: the row of a right answer
        ("<think>x</think>\n<answer> Rome </answer>", 0.0, 0.2),  # s = 0: the row of a wrong one
        ("<think>no idea</think>", 0.0, 0.0),  # no answer, invalid format
    ],
    ids=["valid-hit", "valid", "invalid", "s=1", "s=0", "none"],
)
def test_the_table_mixes_the_right_and_wrong_rows_in_proportion_to_s(response, s, expected):
    details = score_reading(read_response(PROMPT, response), ["Paris"], WEIGHTS, answer_score=s)
    assert details.score == pytest.approx(expected)
    assert details.answer_score == s


def search_r1_row(em: bool, answered: bool, valid: bool, hit: bool, w: FormatWeights) -> float:
    """Search-R1's qa_em_format rules as it writes them (verl/utils/reward_score/qa_em_format.py), for comparison."""
    if em:
        return w.correct_score if valid else w.correct_score - w.format_score
    if valid:
        return w.format_score + (w.retrieval_score if hit else 0.0)
    return w.final_format_score if answered else 0.0


@pytest.mark.parametrize(
    "response",
    [
        SEARCHED + "<think>x</think>\n<answer> Paris </answer>",
        SEARCHED + "<think>x</think>\n<answer> Rome </answer>",
        SEARCHED + "<think>x</think>\n<answer> Paris </answer> extra",
        "<answer> Rome </answer>",
        "<think>x</think>\n<answer></answer>",
        "<think>nothing</think>",
    ],
)
@pytest.mark.parametrize("weights", [WEIGHTS, FormatWeights(0.3, 0.15, 0.0), FormatWeights(0.1 + 0.2, 0.1, 0.7)])
def test_em_as_s_gives_search_r1_s_rows_to_the_last_bit(response, weights):
    reading = read_response(PROMPT, response)
    details = score_reading(reading, ["Paris"], weights)
    answered, hit = reading.answer is not None, details.retrieval_hit
    assert details.score == search_r1_row(bool(details.em), answered, details.format_valid, hit, weights)  # not approx
    assert score_reading(reading, ["Paris"], weights, answer_score=details.em) == details


def test_the_reward_names_are_the_answer_scores_and_the_judge():
    assert reward_names() == ("em", "f1", "cover_em", "judge")
    assert SETTINGS["reward"].kind.names() == reward_names()  # what SEARCH_R1_REWARD accepts


# ---- reward_func on real episodes -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_an_f1_reward_pays_a_nearly_right_answer_in_proportion(
    mode, make_args, tokenizer, engine, policy, search_config
):
    search_config.update(reward="f1", retrieval_score=0.1)
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], NEAR]
    episode = await run_episode(mode, make_args, tokenizer, search_config, reward_key="score")
    reward = await reward_func(episode.args, episode.sample)
    expected = F1_PARIS_FRANCE + (1 - F1_PARIS_FRANCE) * (0.2 + 0.1)  # valid format, Paris was retrieved
    assert reward == {
        "score": pytest.approx(expected),
        "em": 0.0,
        "f1": pytest.approx(F1_PARIS_FRANCE),
        "format_valid": 1.0,
        "retrieval_hit": 1.0,
    }
    assert info(episode.sample)["reward"]["scored_by"] == "f1"
    assert info(episode.sample)["reward"]["f1"] == pytest.approx(F1_PARIS_FRANCE)


async def test_a_cover_em_reward_pays_a_gold_answer_inside_the_answer(
    make_args, tokenizer, engine, policy, search_config
):
    search_config.update(reward="cover_em")
    policy.scripts[QUESTION + "?"] = [SEARCH["generate"], NEAR]
    episode = await run_episode("generate", make_args, tokenizer, search_config)
    assert await reward_func(episode.args, episode.sample) == 1.0
    assert info(episode.sample)["reward"]["em"] == 0.0


async def test_evaluation_stays_pure_em_and_records_the_reward_s_own_score(
    make_args, tokenizer, engine, policy, search_config
):
    search_config.update(reward="f1")
    policy.scripts[QUESTION + "?"] = [SEARCH["generate"], NEAR]
    episode = await run_episode("generate", make_args, tokenizer, search_config, evaluation=True, reward_key="score")
    reward = await reward_func(episode.args, episode.sample)
    assert reward["score"] == 0.0  # EM, no bonus
    assert reward["f1"] == pytest.approx(F1_PARIS_FRANCE)


# ---- the judge --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "expected"), [("Paris", 1.0), ("Lyon", 0.2)])
async def test_a_judge_reward_is_the_table_over_the_judge_s_verdict(
    make_args, tokenizer, engine, policy, search_config, judged, monkeypatch, caplog, answer, expected
):
    key = "sk-training-secret"
    search_config["judge"]["api_key"] = key  # as JUDGE_API_KEY sets it
    policy.scripts[QUESTION + "?"] = [SEARCH["generate"], f"<think>So.</think>\n<answer> {answer} </answer>"]
    episode = await run_episode("generate", make_args, tokenizer, search_config, reward_key="score")
    with caplog.at_level(logging.DEBUG):
        reward = await reward_func(episode.args, episode.sample)
    assert reward["score"] == pytest.approx(expected)
    assert reward["judge"] == (1.0 if answer == "Paris" else 0.0)
    body = judged.bodies[-1]
    assert body["model"] == "judge-7b"
    assert "Question: What is the capital of France?" in body["messages"][0]["content"]  # the question, not the prompt
    assert judged.authorizations[-1] == f"Bearer {key}"
    record = info(episode.sample)["reward"]
    assert record["judge_verdict"]["status"] == ("correct" if answer == "Paris" else "incorrect")
    assert "unscored" not in record and not episode.sample.remove_sample
    assert key not in repr(episode.sample.metadata) + caplog.text


@pytest.mark.parametrize(("failure", "status"), [("http500", "error"), ("no_verdict", "invalid")])
async def test_a_judge_that_is_down_or_answers_nonsense_marks_the_sample_and_the_logs_count_it(
    make_args, tokenizer, engine, policy, search_config, judged, caplog, failure, status
):
    judged.always = failure
    policy.scripts[QUESTION + "?"] = [SEARCH["generate"], "<think>So.</think>\n<answer> Paris </answer>"]
    episode = await run_episode("generate", make_args, tokenizer, search_config, reward_key="score")
    reward = await reward_func(episode.args, episode.sample)
    assert len(judged.bodies) == 2  # both attempts
    record = info(episode.sample)["reward"]
    assert record["unscored"] is True
    assert record["judge_verdict"]["status"] == status
    assert record["judge_verdict"]["attempts"] == 2
    assert episode.sample.remove_sample  # out of the loss and of its group's advantages
    assert reward["judge"] == 0.0 and reward["score"] == pytest.approx(0.2)  # a number for slime, marked above
    args = make_args(use_wandb=True, custom_rollout_log_function_path="generate_with_search.log_rollout_metrics")
    with record_tracking() as calls, caplog.at_level(logging.WARNING):
        log_rollout_data(0, args, [episode.sample], None, 1.0)
    logged = calls[0]["metrics"]
    assert logged["rollout/search_r1/judge/unscored"] == 1
    assert logged["rollout/search_r1/judge/unscored_share"] == 1.0
    assert logged[f"rollout/search_r1/judge/{status}"] == 1
    assert "rollout/search_r1/reward" not in logged  # its placeholder is not averaged in
    assert "the judge left 1 samples unscored" in caplog.text


def test_the_question_is_read_from_the_prompt_or_the_metadata(tokenizer):
    assert question_of(Sample(prompt=chat_prompt(tokenizer, "Who wrote Hamlet"))) == "Who wrote Hamlet?"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Question: Who wrote Hamlet?"}]
    assert question_of(Sample(prompt=messages)) == "Who wrote Hamlet?"
    assert question_of(Sample(prompt="free text", metadata={"question": "Q?"})) == "Q?"


@pytest.mark.parametrize(
    ("sample", "question"),
    [
        (Sample(prompt="  Who wrote Hamlet  "), "Who wrote Hamlet"),  # no "Question:": the prompt itself
        (types.SimpleNamespace(prompt="Question: Who wrote Hamlet?\n"), "Who wrote Hamlet?"),  # no metadata at all
        (Sample(prompt=[{"role": "user", "content": "Who wrote Hamlet"}, {"role": "assistant", "content": "Hm"}]),
         "Who wrote Hamlet"),  # the user's turn, not the assistant's
        (Sample(prompt=[{"role": "system", "content": "Be brief."}]), ""),  # no user turn
        (Sample(prompt=[{"role": "user", "content": None}]), ""),
    ],
    ids=["free text", "no metadata", "assistant turn after", "no user turn", "user turn without content"],
)  # fmt: skip
def test_the_question_falls_back_to_the_user_turn_or_nothing(sample, question):
    assert question_of(sample) == question


async def test_each_grade_names_its_score(search_config, judged):
    config = resolve_config(search_config)
    for name in reward_names():
        result = await grade(config, name, "What is the capital of France?", ["Paris"], "Paris")
        assert (result.name, result.value) == (name, 1.0)
    assert result.verdict.status == "correct"  # the judge's, asked last


async def test_the_judge_is_built_from_the_judge_settings(search_config, judged, tmp_path):
    prompt = tmp_path / "strict_judge.txt"
    prompt.write_text("Strict grader.\nQuestion: {question}\nGold answers: {gold_answers}\nAnswer: {prediction}\n")
    search_config["judge"].update(prompt=str(prompt), max_tokens=512)
    config = resolve_config(search_config)
    settings_used = judge_client(config).config
    assert (settings_used.url, settings_used.model, settings_used.max_tokens) == (judged.url, "judge-7b", 512)
    await grade(config, "judge", "What is the capital of France?", ["Paris"], "Paris")
    assert judged.bodies[-1]["messages"][0]["content"].startswith("Strict grader.\nQuestion: What is the capital")


async def test_evaluation_under_a_judge_reward_is_pure_em_and_never_asks_the_judge(make_args, search_config, judged):
    response = "<think>x</think>\n<answer> Paris </answer>"
    sample = Sample(
        prompt=PROMPT, response=response, label=label("Paris"), metadata={METADATA_KEY: {"evaluation": True}}
    )
    reward = await reward_func(make_args(reward_key="score"), sample)
    assert reward == {"score": 1.0, "em": 1.0, "format_valid": 1.0, "retrieval_hit": 0.0}
    assert judged.bodies == []
    assert "scored_by" not in info(sample)["reward"]


# A Qwen3.5-style template: enable_thinking=False writes an empty thought after the assistant header, anything else
# opens one ("<think>\n") for the model to close.
THINKING_SWITCH_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)


@pytest.mark.parametrize(
    ("template_kwargs", "response", "expected"),
    [
        # The template's empty thought is not the model's: a turn that thinks first, as Search-R1's prompt asks, is
        # valid (1.0 right, 0.2 wrong), and one that answers without a thought of its own is not (0.8). Counting the
        # template's thought as the model's first one made the first two invalid (0.8, 0.1) and the third valid.
        ({"enable_thinking": False}, "<think>It is Paris.</think>\n<answer> Paris </answer>", 1.0),
        ({"enable_thinking": False}, "<think>It is Lyon.</think>\n<answer> Lyon </answer>", 0.2),
        ({"enable_thinking": False}, "<answer> Paris </answer>", 0.8),
        # thinking on: the prompt opened the thought, the response closes it
        ({}, "It is Paris.\n</think>\n\n<answer> Paris </answer>", 1.0),
        ({}, "<think>It is Paris.</think>\n<answer> Paris </answer>", 0.8),  # a thought inside the open one
    ],
    ids=["off-own-thought", "off-own-thought-wrong", "off-no-thought", "on-closes-it", "on-opens-another"],
)
async def test_an_xml_reward_renders_a_messages_prompt_as_the_episode_did(
    make_args, tokenizer_dir, search_config, tmp_path, template_kwargs, response, expected
):
    """Without --apply-chat-template slime hands over messages: the format is checked after the prompt rendered with
    slime's tokenizer and its --apply-chat-template-kwargs, so the thought the template opens or closes counts."""
    switched = AutoTokenizer.from_pretrained(tokenizer_dir)
    switched.chat_template = THINKING_SWITCH_TEMPLATE
    switched.save_pretrained(tmp_path)
    args = make_args(hf_checkpoint=str(tmp_path), apply_chat_template_kwargs=template_kwargs)
    messages = [{"role": "user", "content": "Question: capital of France?"}]
    sample = Sample(prompt=messages, response=response, label=label("Paris"), metadata={METADATA_KEY: {}})
    assert await reward_func(args, sample) == pytest.approx(expected)


# ---- refused at launch ------------------------------------------------------------------------------------------


def resolved(**environ):
    return resolve_config(search_r1_configs({}, environ))


def test_an_unknown_reward_name_is_refused_with_the_accepted_names():
    with pytest.raises(ConfigError) as refused:
        resolved(SEARCH_R1_REWARD="bleu")
    assert str(refused.value) == (
        "environment variable SEARCH_R1_REWARD='bleu' is invalid; accepted: em | f1 | cover_em | judge"
    )


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SEARCH_R1_JUDGE_URL": "http://127.0.0.1:8001/v1"}, "SEARCH_R1_JUDGE_MODEL is not set"),
        ({"SEARCH_R1_REWARD": "judge"}, "SEARCH_R1_REWARD=judge needs a judge endpoint"),
        ({"SEARCH_R1_JUDGE_URL": "ftp://x", "SEARCH_R1_JUDGE_MODEL": "m"}, "must be an http(s) URL"),
    ],
    ids=["url without model", "judge without url", "not http"],
)
def test_judge_settings_that_cannot_work_are_refused(environ, message):
    """At launch and at generate()'s first sample: the settings' own checks, then the judge's (check_slime_args)."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_slime_args(Namespace(), resolved(**environ))


def test_a_judge_prompt_without_its_placeholders_is_refused(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Is {prediction} right?")
    config = resolved(
        SEARCH_R1_JUDGE_URL="http://127.0.0.1:8001/v1", SEARCH_R1_JUDGE_MODEL="m", SEARCH_R1_JUDGE_PROMPT=str(prompt)
    )
    with pytest.raises(ConfigError, match=r"SEARCH_R1_JUDGE_PROMPT: .* lacks \{question\}, \{gold_answers\}"):
        check_slime_args(Namespace(), config)


@pytest.mark.parametrize(
    ("variables", "line"),
    [
        ({"SEARCH_R1_REWARD": "bleu"}, "accepted: em | f1 | cover_em | judge"),
        ({"SEARCH_R1_JUDGE_URL": "http://127.0.0.1:8001/v1"}, "SEARCH_R1_JUDGE_MODEL is not set"),
    ],
)
def test_the_launch_stops_on_one_line(variables, line, monkeypatch, capsys):
    """What run_qwen2.5_3B.sh runs before Ray starts (python -m slime_search_r1.launch PLUGIN --dry-run -- <flags>)."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert launch([str(PLUGIN), "--dry-run", "--", "--use-tis"]) == 1
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and line in stderr


def test_the_post_process_warning_covers_judge_failures_beside_failed_samples(make_args):
    config = resolved(SEARCH_R1_REWARD="judge", SEARCH_R1_JUDGE_URL="http://h:1/v1", SEARCH_R1_JUDGE_MODEL="m")
    [warning] = check_slime_args(make_args(custom_reward_post_process_path=None), config)
    assert warning.startswith(
        "FAILED samples (a tool still failing after its retries) and samples the judge could not score get "
        "remove_sample"
    )
    assert (
        check_slime_args(
            make_args(custom_reward_post_process_path="generate_with_search.post_process_rewards"), config
        )
        == []
    )


# ---- through slime's reward path and its post-processing ------------------------------------------------------


def slime_post_process_with_the_hook(args, samples):
    """slime's RolloutManager._post_process_rewards as written in the slime under test, with
    --custom-reward-post-process-path generate_with_search.post_process_rewards."""
    namespace = {"torch": __import__("torch"), "Sample": Sample}
    exec(compile(_method_source(), "slime/ray/rollout.py", "exec"), namespace)
    manager = types.SimpleNamespace(args=args, custom_reward_post_process_func=post_process_rewards)
    return namespace["_post_process_rewards"](manager, samples)


ANSWERS = ["Paris", "Paris France", "Lyon", "the city of Paris"]  # each group's four samples
QUESTIONS = [QUESTION, "Which city is the capital of France"]  # one per group


class OneAnswerEach:
    """The policy: a search, then for each sample of a group (a question) the next of ANSWERS, in the order the
    samples come to answer."""

    def __init__(self):
        self.answered: dict[str, int] = {}

    def __call__(self, context_text: str) -> str:
        if "<information>" not in context_text:
            return SEARCH["generate"]
        question = question_of_context(context_text)
        given = self.answered.get(question, 0)
        self.answered[question] = given + 1
        return f"<think>So.</think>\n<answer> {ANSWERS[given % len(ANSWERS)]} </answer>"


async def slime_rollout(args, tokenizer, groups: int) -> list[Sample]:
    state = GenerateState(args)
    state.submit_generate_tasks(
        [
            [Sample(prompt=chat_prompt(tokenizer, QUESTIONS[g]), label=label("Paris"), index=4 * g + k, group_index=g)
             for k in range(args.n_samples_per_prompt)]
            for g in range(groups)
        ]
    )  # fmt: skip
    done = await asyncio.gather(*state.pendings)
    state.reset()
    return [sample for group in done for sample in group]


@pytest.mark.parametrize("group_rm", [False, True], ids=["async_rm", "group_rm"])
async def test_an_f1_reward_through_slime_s_reward_path(make_args, tokenizer, engine, search_config, group_rm):
    search_config.update(reward="f1")
    engine.policy = OneAnswerEach()
    args = make_args(n_samples_per_prompt=4, rollout_batch_size=1, reward_key="score", group_rm=group_rm,
                     custom_reward_post_process_path="generate_with_search.post_process_rewards")  # fmt: skip
    samples = await slime_rollout(args, tokenizer, groups=1)
    by_answer = {info(s)["reward"]["f1"]: s for s in samples}
    assert sorted(by_answer) == pytest.approx([0.0, 0.5, F1_PARIS_FRANCE, 1.0])  # Lyon, the city of Paris, ...
    assert all(isinstance(s.reward, dict) and s.reward["f1"] == info(s)["reward"]["f1"] for s in samples)
    raw, advantages = slime_post_process_with_the_hook(args, samples)
    assert raw == [s.reward["score"] for s in samples]
    assert advantages == pytest.approx(slime_post_process_rewards(args, samples)[1], abs=1e-6)  # nothing removed


@pytest.mark.parametrize("group_rm", [False, True], ids=["async_rm", "group_rm"])
async def test_a_judge_reward_through_slime_s_reward_path_keeps_an_unjudged_sample_out_of_its_group(
    make_args, tokenizer, engine, judged, group_rm
):
    def judge_but_not_lyon(prompt: str) -> str:
        if prediction_of(prompt) == "Lyon":
            return "Hmm."  # no verdict, every time: the sample stays unscored
        return default_rule(prompt)

    judged.rule = judge_but_not_lyon
    engine.policy = OneAnswerEach()
    args = make_args(n_samples_per_prompt=4, rollout_batch_size=2, reward_key="score", group_rm=group_rm,
                     custom_reward_post_process_path="generate_with_search.post_process_rewards")  # fmt: skip
    samples = await slime_rollout(args, tokenizer, groups=2)
    unjudged = [i for i, s in enumerate(samples) if info(s)["reward"].get("unscored")]
    assert len(unjudged) == 2 and all(samples[i].remove_sample for i in unjudged)
    assert {info(samples[i])["reward"]["judge_verdict"]["status"] for i in unjudged} == {"invalid"}
    raw, advantages = slime_post_process_with_the_hook(args, samples)
    for group in (range(0, 4), range(4, 8)):
        [removed] = [i for i in group if i in unjudged]
        siblings = [i for i in group if i != removed]
        alone = slime_post_process_rewards(
            types.SimpleNamespace(**{**vars(args), "n_samples_per_prompt": 3, "rollout_batch_size": 1}),
            [samples[i] for i in siblings],
        )[1]
        assert advantages[removed] == 0.0
        assert [advantages[i] for i in siblings] == pytest.approx(alone, abs=1e-6)
    assert [raw[i] for i in range(8) if i not in unjudged] == [
        1.0 if info(s)["reward"]["judge"] else pytest.approx(0.2) for i, s in enumerate(samples) if i not in unjudged
    ]
