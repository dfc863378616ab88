"""Property test: random scripted episodes under random settings always give a token-exact trajectory."""

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import chat_prompt, slime_sampling_params
from generate_with_search import generate, reward_func
from async_http import close_loop_sessions
from slime.utils.types import Sample
from support.fidelity import assert_faithful

WORDS = ["Paris", "capital", "France", "river", "the", "é", "東京", "🙂", "42", "  ", "\n", "<", ">", "/", "&"]
text = st.lists(st.sampled_from(WORDS), min_size=0, max_size=40).map(" ".join)

turn = st.one_of(
    st.builds(lambda t, q: f"<think>{t}</think>\n<search> {q} </search>", text, text),
    st.builds(lambda t, a: f"<think>{t}</think>\n<answer> {a} </answer>", text, text),
    st.builds(lambda t, a, junk: f"<think>{t}</think><answer>{a}</answer>{junk}", text, text, text),
    st.builds(lambda t, q, junk: f"<search>{q}</search>{junk}<answer>{t}</answer>", text, text, text),
    text,  # no action at all
    st.builds(lambda t: f"{t}<|im_end|> trailing", text),  # EOS in the middle of the turn
    st.builds(lambda n: "<think>" + "long thought " * n + "</think>", st.integers(10, 300)),
)

docs = st.lists(st.builds(lambda title, body: f'"{title}"\n{body}', text, text), min_size=1, max_size=5)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    turns=st.lists(turn, min_size=1, max_size=5),
    corpus=docs,
    max_turns=st.integers(1, 4),
    budget=st.integers(1, 700),
    max_obs_tokens=st.integers(16, 200),
    simple_mask=st.booleans(),
    log_probs=st.booleans(),
    honor_stops=st.booleans(),
    evaluation=st.booleans(),
    non_canonical=st.booleans(),
)
def test_random_episodes_are_token_exact(
    make_args,
    tokenizer,
    engine,
    policy,
    retriever,
    search_config,
    turns,
    corpus,
    max_turns,
    budget,
    max_obs_tokens,
    simple_mask,
    log_probs,
    honor_stops,
    evaluation,
    non_canonical,
):
    question = "Where is the thing"
    policy.scripts = {question + "?": turns}
    engine.calls.clear()
    engine.honor_stop_strings = honor_stops
    engine.split_every = 2 if non_canonical else 0
    retriever.docs = [{"id": str(i), "contents": c} for i, c in enumerate(corpus)]
    search_config.update(
        max_turns=max_turns,
        max_obs_tokens=max_obs_tokens,
        loss_mask_mode="simple" if simple_mask else "strict",
        return_logprob=log_probs,
    )
    args = make_args()
    prompt = chat_prompt(tokenizer, question)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    params = slime_sampling_params(budget)

    async def episode():
        try:
            sample = Sample(prompt=prompt, label={"ground_truth": {"target": ["Paris"]}})
            sample = await generate(args, sample, params, evaluation=evaluation)
            reward = await reward_func(args, sample)
            return sample, reward
        finally:
            await close_loop_sessions()

    sample, reward = asyncio.run(episode())
    calls = engine.calls_for(prompt_ids)
    assert_faithful(
        sample,
        calls,
        tokenizer,
        prompt_ids,
        track_log_probs=log_probs,
        train_observations=simple_mask,
        allow_cut=not honor_stops,
    )
    assert sample.response_length <= budget
    assert len(calls) <= max_turns
    assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert 0.0 <= reward <= 1.0
    if evaluation:
        assert reward in (0.0, 1.0)
