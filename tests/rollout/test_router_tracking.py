"""TOKEN_TRACKING_MODE=router_radix / router_handler piece by piece, in process: the probe for the old slime router's
endpoints, its calls and their errors, the trajectory cut out of its cache's answer, the budget the drivers count
while the episode runs, and what they send. The router is a recorded function, the tokenizer a small vocabulary.
(test_modes.py runs the same modes end to end against the loopback router.)"""

import asyncio
from argparse import Namespace
from types import SimpleNamespace

import aiohttp
import pytest

from slime.utils.types import Sample
from slime_search_r1.episode import Turn
from slime_search_r1.tokens import legacy_router
from slime_search_r1.tokens.legacy_router import (
    RouterHandlerDriver,
    RouterRadixDriver,
    RouterTrackingError,
    openai_sampling,
    router_response,
)
from slime_search_r1.tokens.engine import EngineProtocolError, EngineUnavailable
from slime_search_r1.tokens.manual import Trajectory

from support.piece_tokenizer import TOKENIZER

PROMPT = [101, 102, 103]
ROUTER = "http://127.0.0.1:30000"


# ---- the endpoint probe -----------------------------------------------------------------------------------------


class ProbedRouter:
    """The session the probe posts through: answers each POST with `status`, or raises `error`."""

    def __init__(self, status=200, error=None):
        self.status, self.error, self.posts = status, error, []

    def post(self, url, json, timeout):
        self.posts.append((url, json, timeout.total))
        if self.error is not None:
            raise self.error
        router = self

        class Response:
            status = router.status

            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc):
                return False

        return Response()


@pytest.fixture
def probed(monkeypatch):
    """A fresh probe cache and the session it posts through."""
    monkeypatch.setattr(legacy_router, "_supported", {})
    router = ProbedRouter()
    factories = []
    monkeypatch.setattr(legacy_router, "loop_session", lambda key, factory: factories.append(factory) or router)
    router.factories = factories
    return router


async def test_a_router_that_serves_the_endpoint_is_probed_once(probed):
    for status in (200, 400, 422, 500):
        probed.status, probed.posts = status, []
        legacy_router._supported.clear()
        await legacy_router.require_endpoint(ROUTER, "/retrieve_from_text", "router_radix")
        await legacy_router.require_endpoint(ROUTER, "/retrieve_from_text", "router_radix")
        assert probed.posts == [(ROUTER + "/retrieve_from_text", {}, 30)]
    assert probed.factories[0] is aiohttp.ClientSession


@pytest.mark.parametrize("status", [404, 405])
async def test_a_router_without_the_endpoint_is_refused_with_advice(probed, status):
    probed.status = status
    message = (
        r"^TOKEN_TRACKING_MODE=router_handler needs a router that serves /retrieve_from_messages_template: the slime "
        r"router with its radix-tree middleware \(slime before March 2026, launched with --use-slime-router\)\. "
        r"Current slime removed it, and http://127\.0\.0\.1:30000 answers 404\. TOKEN_TRACKING_MODE=manual is "
        r"token-exact with any SGLang engine or router\.$"
    )
    for _ in range(2):  # the verdict is kept: the second check posts nothing
        with pytest.raises(RouterTrackingError, match=message):
            await legacy_router.require_endpoint(ROUTER, "/retrieve_from_messages_template", "router_handler")
    assert len(probed.posts) == 1


@pytest.mark.parametrize("error", [aiohttp.ClientConnectionError("refused"), asyncio.TimeoutError()])
async def test_a_router_that_cannot_be_reached_is_reported(probed, error):
    probed.error = error
    with pytest.raises(RouterTrackingError, match=rf"^cannot reach the router at {ROUTER} to check /x: {error}$"):
        await legacy_router.require_endpoint(ROUTER, "/x", "router_radix")
    probed.error = None  # nothing was kept: the next check probes again
    await legacy_router.require_endpoint(ROUTER, "/x", "router_radix")
    assert len(probed.posts) == 2


# ---- router calls -----------------------------------------------------------------------------------------------


class RecordedRouter:
    """post_with_retries' stand-in: records each call and answers from a list (an exception is raised)."""

    def __init__(self, monkeypatch, *answers):
        self.answers, self.calls = list(answers), []
        monkeypatch.setattr(legacy_router, "post_with_retries", self)

    async def __call__(self, url, payload):
        self.calls.append((url, payload))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.mark.parametrize("error", [EngineProtocolError("HTTP 400: bad"), EngineUnavailable("after 60 attempts")])
async def test_a_router_call_that_fails_names_the_url(monkeypatch, error):
    RecordedRouter(monkeypatch, error)
    with pytest.raises(RouterTrackingError, match=rf"^{ROUTER}/generate: {error}$"):
        await legacy_router.post_to_router(ROUTER + "/generate", {"text": "x"})


async def test_a_router_answer_that_is_no_object_is_refused(monkeypatch):
    RecordedRouter(monkeypatch, ["a", "b"])
    with pytest.raises(
        RouterTrackingError, match=rf"^{ROUTER}/generate answered \"\['a', 'b'\]\", not a JSON object$"
    ):
        await legacy_router.post_to_router(ROUTER + "/generate", {})


async def test_a_long_answer_is_quoted_to_200_characters(monkeypatch):
    RecordedRouter(monkeypatch, "y" * 300)
    with pytest.raises(RouterTrackingError, match=rf"^{ROUTER}/generate answered 'y{{200}}', not a JSON object$"):
        await legacy_router.post_to_router(ROUTER + "/generate", {})


async def test_retrieve_needs_tokens_loss_mask_and_log_probs(monkeypatch):
    whole = {"tokens": [1], "loss_mask": [0], "rollout_logp": None}
    router = RecordedRouter(monkeypatch, whole, {"tokens": [1]}, {"loss_mask": [], "rollout_logp": []})
    assert await legacy_router.retrieve(ROUTER, "/retrieve_from_text", {"text": "t"}) == whole
    assert router.calls == [(ROUTER + "/retrieve_from_text", {"text": "t"})]
    with pytest.raises(RouterTrackingError, match=r"^/r answered without loss_mask, rollout_logp$"):
        await legacy_router.retrieve(ROUTER, "/r", {})
    with pytest.raises(RouterTrackingError, match=r"^/r answered without tokens$"):
        await legacy_router.retrieve(ROUTER, "/r", {})


# ---- the trajectory from the router's cache ---------------------------------------------------------------------


def test_the_response_is_what_follows_the_prompt_up_to_the_models_last_token():
    retrieved = {
        "tokens": PROMPT + [1, 2, 9, 6, 5, 9, 99],
        "loss_mask": [0, 0, 0, 1, 1, 0, 1, 1, 0, 0],
        "rollout_logp": [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3, -0.4, 0.0, 0.0],
    }
    ids, mask, log_probs = router_response(retrieved, PROMPT, track_log_probs=True)
    assert (ids, mask, log_probs) == ([1, 2, 9, 6, 5], [1, 1, 0, 1, 1], [-0.1, -0.2, 0.0, -0.3, -0.4])
    untracked = router_response({**retrieved, "rollout_logp": None}, PROMPT, track_log_probs=False)
    assert untracked == ([1, 2, 9, 6, 5], [1, 1, 0, 1, 1], None)


def test_a_response_the_model_wrote_nothing_of_is_empty_and_the_prompt_is_never_cut():
    retrieved = {"tokens": PROMPT + [9], "loss_mask": [1, 1, 1, 0], "rollout_logp": [0.0] * 4}
    assert router_response(retrieved, PROMPT, track_log_probs=True) == ([], [], [])
    nothing = {"tokens": [9, 9], "loss_mask": [0, 0], "rollout_logp": None}
    assert router_response(nothing, [], track_log_probs=False) == ([], [], None)
    one_after = {"tokens": PROMPT + [5, 9], "loss_mask": [0, 0, 0, 1, 0], "rollout_logp": None}
    assert router_response(one_after, PROMPT, track_log_probs=False) == ([5], [1], None)
    last = {"tokens": PROMPT + [5], "loss_mask": [0, 0, 0, 1], "rollout_logp": [0.0, 0.0, 0.0, -0.5]}
    assert router_response(last, PROMPT, track_log_probs=False) == ([5], [1], [-0.5])


@pytest.mark.parametrize(
    ("retrieved", "track", "message"),
    [
        (
            {"tokens": [101, 102, 104, 5], "loss_mask": [0, 0, 0, 1], "rollout_logp": None},
            False,
            r"^the router's tokens do not start with the prompt's tokens \(different tokenizer or chat template\?\)$",
        ),
        (
            {"tokens": PROMPT + [5], "loss_mask": [0, 0, 0], "rollout_logp": None},
            False,
            r"^router lengths disagree: 4 tokens, 3 loss mask, no log probs$",
        ),
        (
            {"tokens": PROMPT + [5], "loss_mask": [0, 0, 0, 1], "rollout_logp": [0.0] * 5},
            False,
            r"^router lengths disagree: 4 tokens, 4 loss mask, 5 log probs$",
        ),
        (
            {"tokens": PROMPT + [5], "loss_mask": [0, 0, 0, 1], "rollout_logp": None},
            True,
            r"^the router returned no log probs; set TRACK_LOG_PROBS=false or use manual mode$",
        ),
    ],
)
def test_a_router_trajectory_that_does_not_fit_is_refused(retrieved, track, message):
    with pytest.raises(RouterTrackingError, match=message):
        router_response(retrieved, PROMPT, track_log_probs=track)


# ---- the drivers ------------------------------------------------------------------------------------------------


def state_for(*, track=True, return_logprob=True, conversation=()):
    args = Namespace(sglang_router_ip="127.0.0.1", sglang_router_port=30000)
    config = SimpleNamespace(return_logprob=return_logprob)
    trajectory = Trajectory(args, Sample(), PROMPT, track_log_probs=track, train_observations=False)
    state = SimpleNamespace(args=args, config=config, tokenizer=TOKENIZER, conversation=list(conversation))
    return state, trajectory


def radix(**state) -> RouterRadixDriver:
    state, trajectory = state_for(**state)
    return RouterRadixDriver(state, trajectory, SimpleNamespace(prompt_text="Q?"))


async def test_the_radix_driver_checks_its_endpoint_at_the_router_slime_would_use(probed):
    state, _ = state_for()
    state.args.sglang_model_routers = {"actor": ("10.0.0.2", 31000)}  # the policy, as slime names it
    await RouterRadixDriver.prepare(state)
    await RouterHandlerDriver.prepare(state)
    assert RouterRadixDriver(state, state_for()[1], SimpleNamespace(prompt_text="")).router == "http://10.0.0.2:31000"
    assert [url for url, _, _ in probed.posts] == [
        "http://10.0.0.2:31000/retrieve_from_text",
        "http://10.0.0.2:31000/retrieve_from_messages_template",
    ]
    probed.status = 404
    with pytest.raises(
        RouterTrackingError,
        match=rf"^TOKEN_TRACKING_MODE=router_radix needs a router that serves "
        rf"/retrieve_from_text: .* and {ROUTER} answers 404",
    ):
        await RouterRadixDriver.prepare(state_for()[0])


async def test_the_radix_driver_sends_the_text_so_far_and_counts_what_the_router_generated(monkeypatch):
    d = radix()
    assert (d.router, d.context_length, d.response_length, d.text) == (ROUTER, 3, 0, "Q?")
    router = RecordedRouter(
        monkeypatch,
        {"text": "dropped", "output_ids": [1, 2, 99], "meta_info": {"finish_reason": {"type": "stop"}}},
        {"text": " x", "meta_info": {"finish_reason": {"type": "length"}, "completion_tokens": 4}},
        {"output_ids": [6], "meta_info": {"finish_reason": None, "completion_tokens": 2}},
    )
    turn = await d.generate({"max_new_tokens": 8})
    assert turn == Turn([1, 2, 99], "stop", text="<search> Paris<|im_end|>")
    assert (d.context_length, d.response_length) == (6, 3)
    d.add_observation([9, 5])
    assert d.text == "Q?<search> Paris<|im_end|>\n</search>"
    assert (d.context_length, d.response_length) == (8, 5)
    turn = await d.generate({"max_new_tokens": 3})
    assert turn == Turn([], "length", text=" x")
    assert (d.context_length, d.response_length) == (12, 9)
    turn = await d.generate({})
    assert turn == Turn([6], "stop", text=" x")
    assert (d.context_length, d.response_length) == (14, 11)
    assert router.calls == [
        (ROUTER + "/generate", {"text": "Q?", "sampling_params": {"max_new_tokens": 8}, "return_logprob": True}),
        (
            ROUTER + "/generate",
            {
                "text": "Q?<search> Paris<|im_end|>\n</search>",
                "sampling_params": {"max_new_tokens": 3},
                "return_logprob": True,
            },
        ),
        (
            ROUTER + "/generate",
            {"text": "Q?<search> Paris<|im_end|>\n</search> x", "sampling_params": {}, "return_logprob": True},
        ),
    ]
    assert d.retrieve_payload() == {"text": "Q?<search> Paris<|im_end|>\n</search> x x", "return_logp": True}


def test_the_radix_driver_appends_a_reply_as_the_text_the_router_sees():
    d = radix()
    d.add_observation([99, 9, 5])  # a special token in the reply is text too
    assert d.text == "Q?<|im_end|>\n</search>"
    assert (d.context_length, d.response_length) == (6, 3)


async def test_an_aborted_radix_turn_adds_nothing(monkeypatch):
    d = radix(return_logprob=False)
    router = RecordedRouter(monkeypatch, {"text": "t", "meta_info": {"finish_reason": {"type": "abort"}}})
    assert await d.generate({}) == Turn([], "abort")
    assert (d.text, d.context_length, d.response_length) == ("Q?", 3, 0)
    assert router.calls[0][1]["return_logprob"] is False


async def test_at_the_end_the_trajectory_is_the_routers_and_an_aborted_sample_asks_for_none(monkeypatch):
    d = radix()
    whole = {
        "tokens": PROMPT + [1, 2, 9, 99],
        "loss_mask": [0, 0, 0, 1, 1, 0, 0],
        "rollout_logp": [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0],
    }
    router = RecordedRouter(monkeypatch, whole)
    await d.finish(Sample.Status.ABORTED)
    assert router.calls == [] and d.trajectory.sample.tokens == PROMPT
    await d.finish(Sample.Status.COMPLETED)
    assert router.calls == [(ROUTER + "/retrieve_from_text", {"text": "Q?", "return_logp": True})]
    sample = d.trajectory.sample
    assert sample.tokens == PROMPT + [1, 2]
    assert sample.loss_mask == [1, 1]
    assert sample.rollout_log_probs == [-0.5, -0.25]
    assert sample.response_length == 2


async def test_a_router_trajectory_without_log_probs_fails_a_driver_that_tracks_them(monkeypatch):
    d = radix(track=True)
    RecordedRouter(monkeypatch, {"tokens": PROMPT + [5], "loss_mask": [0, 0, 0, 1], "rollout_logp": None})
    with pytest.raises(RouterTrackingError, match=r"^the router returned no log probs"):
        await d.finish(Sample.Status.TRUNCATED)
    untracked = radix(track=False)
    RecordedRouter(monkeypatch, {"tokens": PROMPT + [5], "loss_mask": [0, 0, 0, 1], "rollout_logp": None})
    await untracked.finish(Sample.Status.TRUNCATED)
    assert untracked.trajectory.sample.rollout_log_probs is None


def test_the_base_driver_has_no_payload_of_its_own():
    state, trajectory = state_for()
    with pytest.raises(NotImplementedError):
        legacy_router._RouterDriver(state, trajectory).retrieve_payload()


def test_sglang_sampling_params_become_openai_fields():
    params = dict(
        max_new_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=-1,
        stop=["</search>"],
        stop_token_ids=[99],
        skip_special_tokens=False,
        no_stop_trim=True,
    )
    assert openai_sampling(params) == {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,
        "stop": ["</search>"],
        "stop_token_ids": [99],
        "skip_special_tokens": False,
    }
    assert openai_sampling({"max_new_tokens": 1, "temperature": None, "stop": None}) == {"max_tokens": 1}


def handler(**state) -> RouterHandlerDriver:
    state, trajectory = state_for(**state)
    protocol = SimpleNamespace(
        messages=[{"role": "user", "content": "Q?"}],
        tool_schemas=[{"type": "function"}],
        renderer=SimpleNamespace(end_of_turn_token=99),
    )
    return RouterHandlerDriver(state, trajectory, protocol)


async def test_the_handler_driver_sends_the_conversation_and_counts_the_completion(monkeypatch):
    d = handler(conversation=[{"role": "assistant", "content": "a"}])
    assert (d.router, d.context_length, d.response_length, d.ended_turn) == (ROUTER, 3, 0, False)
    message = {"role": "assistant", "content": "<search>q</search>", "tool_calls": None}
    router = RecordedRouter(
        monkeypatch,
        {"choices": [{"message": message, "finish_reason": "tool_calls"}], "usage": {"completion_tokens": 4}},
        {"choices": [{"message": {"content": None}, "finish_reason": "length"}], "usage": {"completion_tokens": 2}},
        {"choices": [{"finish_reason": "abort"}]},
    )
    turn = await d.generate({"max_new_tokens": 9, "temperature": 1.0})
    assert turn == Turn([], "stop", text="<search>q</search>", message=message)
    assert (d.context_length, d.response_length, d.ended_turn) == (7, 4, True)
    assert router.calls[0] == (
        ROUTER + "/v1/chat/completions",
        {
            "model": "default",
            "messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "a"}],
            "tools": [{"type": "function"}],
            "stream": False,
            "max_tokens": 9,
            "temperature": 1.0,
        },
    )
    # the reply begins with the end-of-turn token completion_tokens already counted
    d.add_observation([99, 9, 6])
    assert (d.context_length, d.response_length) == (9, 6)
    assert await d.generate({"max_new_tokens": 1}) == Turn([], "length", text="", message={"content": None})
    assert (d.context_length, d.response_length, d.ended_turn) == (11, 8, False)
    d.add_observation([99, 9])  # after a turn cut at the length limit the token is the reply's own
    assert (d.context_length, d.response_length) == (13, 10)
    assert await d.generate({"max_new_tokens": 1}) == Turn([], "abort", text="", message={})
    assert (d.context_length, d.response_length, d.ended_turn) == (13, 10, False)
    d.state.conversation.append({"role": "tool", "content": "r"})
    assert d.retrieve_payload() == {
        "messages": [
            {"role": "user", "content": "Q?"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "r"},
        ],
        "tools": [{"type": "function"}],
        "add_generation_prompt": False,
    }


async def test_a_handler_turn_that_ended_on_a_stop_counts_the_reply_without_its_end_of_turn_token(monkeypatch):
    d = handler()
    RecordedRouter(monkeypatch, {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]})
    assert await d.generate({"max_new_tokens": 1}) == Turn([], "stop", text="x", message={"content": "x"})
    assert (d.context_length, d.response_length, d.ended_turn) == (3, 0, True)  # no usage: nothing counted
    d.add_observation([9, 99])  # no end-of-turn token in front: all of it counts
    assert (d.context_length, d.response_length) == (5, 2)


@pytest.mark.parametrize("output", [{}, {"choices": []}, {"choices": None}, {"choices": ["text"]}])
async def test_a_chat_answer_without_a_choice_is_refused(monkeypatch, output):
    RecordedRouter(monkeypatch, output)
    with pytest.raises(RouterTrackingError, match=r"^/v1/chat/completions answered without a choice: "):
        await handler().generate({"max_new_tokens": 1})
