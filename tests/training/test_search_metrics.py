"""The rollout log functions: search metrics of finished samples, handed to slime's tracking call at slime's step.

The samples come from real episodes against the loopback engine and retriever (XML and chat), scored by
reward_func as slime does (aborted samples are not scored); slime's side of the call is the stand-in of
log_rollout_data / log_eval_rollout_data in support/slime_rollout.py, its tracking call recorded by support.tracking.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import generate_with_search
from slime_search_r1.training import metrics as search_metrics
from support.episodes import (
    ANSWER_TURN,
    BARE_CALL,
    LONG_THOUGHT,
    MALFORMED,
    NO_ACTION_TURN,
    SEARCH_TURN,
    WRONG_TURN,
    chat_sample,
    search_seconds,
    xml_sample,
)
from generate_with_search import generate, reward_func
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from support.slime_compat import subprocess_pythonpath
from support.slime_rollout import eval_data, log_eval_rollout_data, log_rollout_data, slime_sampling_params
from support.tracking import record_tracking

REPO = Path(__file__).resolve().parents[2]
TRAIN = "rollout/search_r1/"


@pytest.fixture
def logged():
    with record_tracking() as calls:
        yield calls


async def xml_rollout(args, tokenizer, policy, question, script, *, budget=1024, evaluation=False, metadata=None):
    policy.scripts[question + "?"] = script
    sample = xml_sample(tokenizer, question, metadata=dict(metadata or {}))
    return await generate(args, sample, slime_sampling_params(budget), evaluation=evaluation)


async def chat_rollout(args, config, policy, question, script):
    policy.scripts[question + "?"] = script
    sample = chat_sample(question)
    config["llm_api_mode"] = "chat"
    try:
        return await generate(args, sample, slime_sampling_params(1024))
    finally:
        config["llm_api_mode"] = "generate"


@pytest.fixture
def served() -> dict[str, list[float]]:
    """How long the retriever took to answer each of a sample's search requests, by sample name (mixed_batch fills
    it): a latency the plugin records must hold the time its requests took to be answered."""
    return {}


@pytest.fixture
async def mixed_batch(make_args, tokenizer, policy, engine, retriever, search_config, served):
    """One sample of each kind, by name, scored as slime scores them (an aborted sample gets no reward)."""
    retriever.latency_s = 0.02  # each answer takes some time, so a latency that leaves it out is visibly short
    args = make_args()
    batch = {}

    async def run(name, episode):
        answered = len(retriever.answer_seconds)
        batch[name] = await episode
        served[name] = retriever.answer_seconds[answered:]

    await run("right", xml_rollout(args, tokenizer, policy, "Right", [SEARCH_TURN, ANSWER_TURN]))
    await run("wrong", xml_rollout(args, tokenizer, policy, "Wrong", [SEARCH_TURN, WRONG_TURN]))
    await run("invalid_then_right", xml_rollout(args, tokenizer, policy, "Invalid", [NO_ACTION_TURN, ANSWER_TURN]))
    await run("max_turns", xml_rollout(args, tokenizer, policy, "Searcher", [SEARCH_TURN]))
    await run("token_budget", xml_rollout(args, tokenizer, policy, "Thinker", [LONG_THOUGHT], budget=60))
    await run(
        "chat_malformed_then_right",
        chat_rollout(args, search_config, policy, "Chat", [MALFORMED, BARE_CALL, ANSWER_TURN]),
    )
    retriever.down = True
    await run("failed", xml_rollout(args, tokenizer, policy, "Failed", [SEARCH_TURN, ANSWER_TURN]))
    retriever.down = False
    GenerateState(args).aborted = True
    await run("aborted", xml_rollout(args, tokenizer, policy, "Aborted", [SEARCH_TURN, ANSWER_TURN]))
    GenerateState(args).aborted = False
    for sample in batch.values():
        if sample.status != Sample.Status.ABORTED:
            sample.reward = await reward_func(args, sample)
    return args, batch


def episode(sample) -> dict:
    return sample.metadata["search_r1"]


async def test_the_mixed_batch_is_what_the_metrics_will_be_checked_against(mixed_batch):
    _, batch = mixed_batch
    statuses = {name: sample.status.value for name, sample in batch.items()}
    assert statuses == {
        "right": "completed",
        "wrong": "completed",
        "invalid_then_right": "completed",
        "max_turns": "truncated",
        "token_budget": "truncated",
        "chat_malformed_then_right": "completed",
        "failed": "failed",
        "aborted": "aborted",
    }
    assert {name: sample.reward for name, sample in batch.items()} == {
        "right": 1.0,
        "wrong": pytest.approx(0.2),
        "invalid_then_right": pytest.approx(0.8),
        "max_turns": 0.0,
        "token_budget": 0.0,
        "chat_malformed_then_right": pytest.approx(0.8),
        "failed": 0.0,
        "aborted": None,
    }


async def test_invalid_actions_are_counted_per_turn_in_both_protocols_but_not_a_turn_cut_by_the_budget(mixed_batch):
    _, batch = mixed_batch
    invalid = {name: episode(sample)["invalid_actions"] for name, sample in batch.items()}
    assert invalid == {
        "right": 0,
        "wrong": 0,
        "invalid_then_right": 1,  # XML: a turn with no tag
        "max_turns": 0,  # the last turn's search is valid, only not run
        "token_budget": 0,  # no tag, but cut by the budget
        "chat_malformed_then_right": 1,  # chat: an unparsable tool call
        "failed": 0,
        "aborted": 0,
    }


async def test_every_search_call_leaves_its_latency_failed_ones_included(mixed_batch, served):
    _, batch = mixed_batch
    latencies = {name: search_seconds(sample) for name, sample in batch.items()}
    assert {name: len(values) for name, values in latencies.items()} == {
        "right": 1,
        "wrong": 1,
        "invalid_then_right": 0,
        "max_turns": 2,  # the third turn's search is not run
        "token_budget": 0,
        "chat_malformed_then_right": 1,
        "failed": 1,
        "aborted": 0,
    }
    # Each latency holds the time its request(s) took to be answered (the failed call: all its attempts); both are
    # read from one monotonic clock, and the answer happens inside the call, so this holds however slow the machine.
    for name, values in latencies.items():
        answers = served[name]
        if name == "failed":
            assert len(answers) == 3 and values[0] >= sum(answers)  # search_attempts=3, then it failed for good
        else:
            assert len(answers) == len(values)
            assert all(value >= answer > 0 for value, answer in zip(values, answers, strict=True))


async def test_reward_func_leaves_its_details_in_the_metadata(mixed_batch):
    _, batch = mixed_batch
    assert episode(batch["wrong"])["reward"] == {
        "score": pytest.approx(0.2),
        "em": 0.0,
        "format_valid": 1.0,
        "retrieval_hit": 1.0,
    }
    assert "reward" not in episode(batch["aborted"])  # slime does not score aborted samples


async def test_rollout_metrics_of_a_mixed_batch_reach_slimes_tracking_call(mixed_batch, logged):
    args, batch = mixed_batch
    samples = list(batch.values())
    args.use_wandb = args.use_tensorboard = True
    args.custom_rollout_log_function_path = "generate_with_search.log_rollout_metrics"

    log_rollout_data(7, args, samples, None, 12.5)

    # ours, then slime's default logging (the function returned False), each to wandb and TensorBoard
    assert [call["backend"] for call in logged] == ["wandb", "tensorboard", "wandb", "tensorboard"]
    ours, tensorboard = logged[0]["metrics"], logged[1]
    assert "rollout/response_len/mean" in logged[2]["metrics"]
    assert ours.pop("rollout/step") == 7
    assert tensorboard["step"] == 7
    assert tensorboard["metrics"] == ours
    assert all(key.startswith(TRAIN) for key in ours)
    metrics = {key.removeprefix(TRAIN): value for key, value in ours.items()}

    n = 8
    assert metrics["samples"] == n
    assert metrics["turns/mean"] == pytest.approx((2 + 2 + 2 + 3 + 1 + 3 + 1 + 0) / n)
    assert metrics["turns/max"] == 3
    assert metrics["searches/mean"] == pytest.approx((1 + 1 + 0 + 2 + 0 + 1 + 0 + 0) / n)
    assert metrics["searches/max"] == 2
    assert metrics["searched_share"] == pytest.approx(5 / n)  # right, wrong, max_turns, chat, failed
    assert metrics["invalid_actions/mean"] == pytest.approx(2 / n)
    assert metrics["invalid_action_share"] == pytest.approx(2 / n)
    assert metrics["tools/search/failures"] == 1
    assert metrics["failed_share"] == pytest.approx(1 / n)
    finishes = {key.removeprefix("finish/"): value for key, value in metrics.items() if key.startswith("finish/")}
    assert finishes == {
        "answer": pytest.approx(4 / n),
        "max_turns": pytest.approx(1 / n),
        "token_budget": pytest.approx(1 / n),
        "context_length": 0.0,
        "tool_failed": pytest.approx(1 / n),
        "engine_error": 0.0,
        "template_error": 0.0,
        "aborted": pytest.approx(1 / n),
    }
    # 7 scored samples: EM right, invalid_then_right, chat; well-formed: right, wrong; retrieval hit: same two
    assert metrics["em"] == pytest.approx(3 / 7)
    assert metrics["format_valid"] == pytest.approx(2 / 7)
    assert metrics["retrieval_hit"] == pytest.approx(2 / 7)
    assert metrics["reward"] == pytest.approx((1.0 + 0.2 + 0.8 + 0.8) / 7)
    assert metrics["well_formed_wrong_share"] == pytest.approx(1 / 7)  # "wrong": the format bonus alone
    # observation tokens are the response tokens outside the loss (LOSS_MASK_MODE=strict)
    masked_out = [s.response_length - sum(s.loss_mask) for s in samples]
    assert metrics["observation_tokens/mean"] == pytest.approx(sum(masked_out) / n)
    assert metrics["observation_tokens/max"] == max(masked_out)
    latencies = [value for s in samples for value in search_seconds(s)]
    assert metrics["tools/search/latency/p50"] == pytest.approx(np.percentile(latencies, 50))
    assert metrics["tools/search/latency/p99"] == pytest.approx(np.percentile(latencies, 99))
    assert metrics["tools/search/latency/p50"] >= 0.02  # the retriever's latency, per search
    by_status = {status: [s.response_length for s in samples if s.status.value == status] for status in (
        "completed", "truncated", "failed", "aborted"
    )}  # fmt: skip
    for status, lengths in by_status.items():
        assert metrics[f"response_length/{status}"] == pytest.approx(sum(lengths) / len(lengths))


async def test_latency_percentiles_are_over_searches_not_over_samples(logged):
    def finished(latencies):
        search = {"calls": len(latencies), "failures": 0, "seconds": latencies}
        stats = {"turns": 1, "tools": {"search": search}, "finish_reason": "answer"}
        return Sample(status=Sample.Status.COMPLETED, metadata={"search_r1": stats})

    samples = [finished([0.1] * 9), finished([5.0])]
    metrics = search_metrics.search_metrics(samples)
    assert metrics["tools/search/latency/p50"] == pytest.approx(0.1)  # per sample it would be 2.55
    assert metrics["tools/search/latency/p99"] == pytest.approx(np.percentile([0.1] * 9 + [5.0], 99))


def test_the_metrics_never_read_a_token_list(mixed_batch):
    class Untouchable(list):
        def __iter__(self):
            raise AssertionError("a token list was read")

        def __len__(self):
            raise AssertionError("a token list was read")

    _, batch = mixed_batch
    for sample in batch.values():
        sample.tokens = Untouchable(sample.tokens)
        sample.loss_mask = Untouchable(sample.loss_mask or [])
        sample.rollout_log_probs = Untouchable(sample.rollout_log_probs or [])
    assert search_metrics.search_metrics(list(batch.values()))["samples"] == 8


async def test_samples_this_plugin_did_not_generate_log_nothing(make_args, logged):
    args = make_args(use_wandb=True, custom_rollout_log_function_path="generate_with_search.log_rollout_metrics")
    samples = [Sample(status=Sample.Status.COMPLETED, response_length=5)]
    assert generate_with_search.log_rollout_metrics(0, args, samples, None, 1.0) is False
    assert logged == []
    log_rollout_data(0, args, samples, None, 1.0)
    assert [call["metrics"]["rollout/response_len/mean"] for call in logged] == [5.0]  # slime's own, unchanged


async def test_eval_metrics_per_dataset_with_em_per_data_source_at_the_train_step(
    make_args, tokenizer, policy, engine, retriever, search_config, logged
):
    args = make_args(
        use_tensorboard=True,
        eval_reward_key="em",
        wandb_always_use_train_step=True,
        rollout_batch_size=32,
        n_samples_per_prompt=8,
        global_batch_size=128,
        custom_eval_rollout_log_function_path="generate_with_search.log_eval_rollout_metrics",
    )

    async def evaluated(question, script, source=None):
        metadata = {"data_source": source} if source else {}
        sample = await xml_rollout(args, tokenizer, policy, question, script, evaluation=True, metadata=metadata)
        sample.reward = await reward_func(args, sample)
        return sample

    tagged = [
        await evaluated("Nq right", [SEARCH_TURN, ANSWER_TURN], "nq"),
        await evaluated("Nq wrong", [SEARCH_TURN, WRONG_TURN], "nq"),
        await evaluated("Hotpot right", [ANSWER_TURN], "hotpotqa"),
    ]
    untagged = [await evaluated("Plain wrong", [SEARCH_TURN, WRONG_TURN])]
    data = eval_data("search_r1_test", tagged, "em") | eval_data("plain", untagged, "em")

    log_eval_rollout_data(3, args, data)

    assert [call["backend"] for call in logged] == ["tensorboard", "tensorboard"]  # ours, then slime's
    ours, slimes = logged
    assert ours["step"] == 3 * 32 * 8 // 128  # --wandb-always-use-train-step
    assert slimes["step"] == 3 * 32 * 8 // 128
    assert slimes["metrics"]["eval/search_r1_test"] == pytest.approx(2 / 3)
    metrics = ours["metrics"]
    test = "eval/search_r1/search_r1_test/"
    assert metrics[test + "em"] == pytest.approx(2 / 3)  # pure EM in evaluation
    assert metrics[test + "reward"] == pytest.approx(2 / 3)  # no format bonus in evaluation
    assert metrics[test + "em_by_source/nq"] == pytest.approx(0.5)
    assert metrics[test + "em_by_source/hotpotqa"] == 1.0
    assert metrics[test + "em_source_average"] == pytest.approx(0.75)  # mean over sources, as Search-R1's "Avg"
    assert metrics[test + "searches/mean"] == pytest.approx(2 / 3)
    assert metrics["eval/search_r1/plain/em"] == 0.0
    assert not any(key.startswith("eval/search_r1/plain/em_by_source") for key in metrics)  # no source named


def test_the_plugin_imports_without_slimes_logging_module():
    """slime's logging_utils imports wandb at import time: the plugin must load it only when it logs."""
    code = "import sys, generate_with_search; print(sorted(m for m in sys.modules if m.startswith('slime.obs')))"
    env = {**os.environ, "PYTHONPATH": subprocess_pythonpath()}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    # (slime's rollout module itself imports slime.observability's tracing helpers, which need no wandb)
    assert "'slime.observability.logging_utils'" not in result.stdout
    assert "'slime.observability.metric_utils'" not in result.stdout
