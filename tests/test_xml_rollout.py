"""End-to-end XML-mode rollouts: generate() against the loopback engine and retriever."""

import copy

import pytest

import generate_with_search
from slime_search_r1.tokens import engine as sglang_engine
from conftest import chat_prompt, slime_sampling_params
from generate_with_search import generate, reward_func
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import init_http_client
from slime_search_r1.config import REWARD_POST_PROCESS_PATH, ConfigError
from slime_search_r1.tokens.engine import EngineProtocolError, EngineUnavailable
from slime.utils.types import Sample
from support.fidelity import assert_faithful
from support.slime_rollout import router_address

QUESTION = "What is the capital of France"
SEARCH_TURN = "<think>I need to look this up.</think>\n<search> capital of France </search>"
ANSWER_TURN = "<think>The documents say Paris.</think>\n<answer> Paris </answer>"
WRONG_TURN = "<think>The documents say Berlin.</think>\n<answer> Berlin </answer>"


def label(*answers):
    return {"style": "rule", "ground_truth": {"target": list(answers)}}


async def rollout(
    make_args, tokenizer, *, max_new_tokens=1024, evaluation=False, sample=None, question=QUESTION, **kw
):
    args = make_args(**kw)
    prompt = chat_prompt(tokenizer, question)
    sample = sample or Sample(prompt=prompt, label=label("Paris"))
    params = slime_sampling_params(max_new_tokens)
    out = await generate(args, sample, params, evaluation=evaluation)
    return args, out, tokenizer.encode(prompt, add_special_tokens=False)


def info(sample):
    return sample.metadata["search_r1"]


async def test_engine_5xx_is_retried_until_it_recovers(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    engine.fail_next(2, status=503)
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert engine.failures_left == 0
    assert sample.status == Sample.Status.COMPLETED
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)


async def test_sampling_params_are_not_mutated(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    params = slime_sampling_params(512)
    params["stop"] = ["<|endoftext|>"]
    before = copy.deepcopy(params)
    args = make_args()
    prompt = chat_prompt(tokenizer, QUESTION)
    await generate(args, Sample(prompt=prompt, label=label("Paris")), params, evaluation=True)
    assert params == before
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    for call in engine.calls_for(prompt_ids):
        assert call.sampling_params["stop"] == ["<|endoftext|>", "</search>", "</answer>"]
        assert call.sampling_params["temperature"] == 1.0 and call.sampling_params["no_stop_trim"] is True


async def test_messages_prompt_is_rendered_with_the_chat_template(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    from slime_search_r1.data import search_r1_prompt

    messages = [{"role": "user", "content": search_r1_prompt(QUESTION)}]
    sample = Sample(prompt=messages, label=label("Paris"))
    args, sample, prompt_ids = await rollout(make_args, tokenizer, sample=sample)
    assert prompt_ids == sample.tokens[: len(prompt_ids)]
    assert sample.status == Sample.Status.COMPLETED
    assert await reward_func(args, sample) == 1.0


def test_configs_are_exposed_for_slime_users():
    config = generate_with_search.SEARCH_R1_CONFIGS
    for key in ("max_turns", "topk", "search_concurrency", "search_backend", "return_logprob", "format_score"):
        assert key in config


async def test_slime_post_transport(make_args, tokenizer, engine, policy, search_config):
    search_config["engine_transport"] = "slime"
    init_http_client(make_args())  # slime's rollout manager does this before the first rollout
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert sample.status == Sample.Status.COMPLETED
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)


async def test_consistent_hashing_keeps_a_sample_on_one_engine(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    sample = Sample(prompt=chat_prompt(tokenizer, QUESTION), label=label("Paris"), session_id="session-42")
    _, sample, prompt_ids = await rollout(make_args, tokenizer, sample=sample, router_policy="consistent_hashing")
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2 and all(c.headers.get("x-smg-routing-key") == "session-42" for c in calls)


async def test_engine_4xx_fails_fast_with_the_engine_message(make_args, tokenizer, engine, search_config):
    engine.fail_next(1, status=400)
    with pytest.raises(EngineProtocolError, match="HTTP 400: .*injected failure"):
        await rollout(make_args, tokenizer)
    assert engine.failures_left == 0


async def test_engine_that_never_recovers_raises_after_its_attempts(
    make_args, tokenizer, engine, search_config, monkeypatch
):
    monkeypatch.setattr(sglang_engine, "ENGINE_ATTEMPTS", 3)
    monkeypatch.setattr(sglang_engine, "ENGINE_RETRY_WAIT_S", 0.01)
    engine.fail_next(10, status=502)
    with pytest.raises(EngineUnavailable, match="did not answer after 3 attempts.*HTTP 502"):
        await rollout(make_args, tokenizer)
    assert engine.failures_left == 7


async def test_min_new_tokens_never_exceeds_what_a_turn_is_offered(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args = make_args()
    prompt = chat_prompt(tokenizer, QUESTION)
    params = slime_sampling_params(120) | {"min_new_tokens": 100}
    sample = await generate(args, Sample(prompt=prompt, label=label("Paris")), params, evaluation=True)
    calls = engine.calls_for(tokenizer.encode(prompt, add_special_tokens=False))
    assert len(calls) >= 2 and sample.status != Sample.Status.FAILED
    for call in calls:
        assert call.sampling_params["min_new_tokens"] <= call.sampling_params["max_new_tokens"]
    assert params["min_new_tokens"] == 100


# ---- slime's own settings reach the rollout ---------------------------------------------------------------------


@pytest.fixture
def note_template_dir(tokenizer_dir, tmp_path):
    """The Qwen2.5 tokenizer with a chat template that takes a keyword, as Qwen3's enable_thinking does."""
    import shutil

    folder = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_dir, folder)
    template = folder / "chat_template.jinja"
    template.write_text("{%- if note is defined %}{{- 'NOTE: ' + note + '\\n' }}{%- endif %}" + template.read_text())
    return str(folder)


@pytest.mark.parametrize(
    ("flag", "own", "expected"),
    [
        ({"note": "from slime's flag"}, {}, "from slime's flag"),
        ({"note": "flag"}, {"note": "the sample's"}, "the sample's"),
    ],
    ids=["slime flag", "sample's own wins"],
)
@pytest.mark.parametrize("mode", ["generate", "chat"])
async def test_apply_chat_template_kwargs_reach_the_template(
    make_args, note_template_dir, engine, policy, search_config, mode, flag, own, expected
):
    search_config["llm_api_mode"] = mode
    args = make_args(hf_checkpoint=note_template_dir, apply_chat_template_kwargs=flag)
    messages = [{"role": "user", "content": f"Question: {QUESTION}?"}]  # XML mode without --apply-chat-template
    sample = Sample(prompt=messages, label=label("Paris"), apply_chat_template_kwargs=own)
    await generate(args, sample, slime_sampling_params(64))
    tokenizer = GenerateState(args).tokenizer
    assert tokenizer.decode(engine.calls[0].input_ids).startswith(f"NOTE: {expected}\n")


async def test_the_engine_is_reached_through_slime_s_model_routers(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [ANSWER_TURN]
    # --sglang-config: the policy ("actor") has its own router; slime's default router address is elsewhere
    routers = {"actor": tuple(router_address(engine.url).values()), "ref": ("127.0.0.1", 9)}
    args, sample, _ = await rollout(
        make_args, tokenizer, sglang_router_ip="127.0.0.1", sglang_router_port=9, sglang_model_routers=routers
    )
    assert sample.status == Sample.Status.COMPLETED and len(engine.calls) == 1
    search_config["engine_model"] = "policy"  # SEARCH_R1_ENGINE_MODEL names it when it is not "actor"
    routers["policy"] = routers.pop("actor")
    _, sample, _ = await rollout(make_args, tokenizer, sglang_router_ip="127.0.0.1", sglang_router_port=9,
                                 sglang_model_routers=routers)  # fmt: skip
    assert sample.status == Sample.Status.COMPLETED and len(engine.calls) == 2


async def test_partial_rollout_is_refused_at_the_first_sample(make_args, tokenizer, engine, search_config):
    with pytest.raises(ConfigError, match="--partial-rollout is not supported"):
        await rollout(make_args, tokenizer, partial_rollout=True)
    assert engine.calls == []


async def test_a_missing_reward_post_process_is_warned_about_once(
    make_args, tokenizer, engine, policy, search_config, caplog, monkeypatch
):
    monkeypatch.setattr(generate_with_search, "_warned", set())
    policy.scripts[QUESTION + "?"] = [ANSWER_TURN]
    for _ in range(2):
        await rollout(make_args, tokenizer, n_samples_per_prompt=8)
    warnings = [r for r in caplog.records if "siblings' advantages" in r.getMessage()]
    assert len(warnings) == 1
    caplog.clear()
    monkeypatch.setattr(generate_with_search, "_warned", set())
    await rollout(make_args, tokenizer, custom_reward_post_process_path=REWARD_POST_PROCESS_PATH)
    assert not [r for r in caplog.records if "siblings' advantages" in r.getMessage()]
