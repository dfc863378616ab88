"""tokens/engine.py in process: the /generate call (its transport, retries and the prompt-length check) and the
answer read as SGLang 0.5.15.post1 and 0.5.23 write it (standin/sglang_rules.py cites their source): ids, log
probs and weight-version spans out of a good answer, EngineProtocolError naming what is wrong with a bad one (the
episode then ends FAILED: test_engine_answers.py shows it through generate()). No server: the POST is a recorded
function."""

import logging
import math

import pytest

from slime_search_r1.episode import ENGINE_VERSIONS, EngineVersions, Turn
from slime_search_r1.http_client import RequestFailed, RetryableRequestFailed
from slime_search_r1.tokens import engine
from slime_search_r1.tokens.engine import (
    EngineProtocolError,
    EngineUnavailable,
    parse_engine_output,
    read_weight_versions,
)


@pytest.fixture(autouse=True)
def fresh_engine_versions():
    ENGINE_VERSIONS.forget()
    yield
    ENGINE_VERSIONS.forget()


# ---- the /generate answer ---------------------------------------------------------------------------------------


def test_an_answer_with_log_probs_gives_ids_log_probs_and_one_version_span():
    info = {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5, 5, None], [-1, 6, None]]}
    info["weight_version"] = 4
    turn = parse_engine_output({"meta_info": info, "output_ids": [5, 6]}, True)
    assert turn == Turn([5, 6], "length", log_probs=[-0.5, -1.0], meta_info=info, versions=[(0, 2, "4")])
    assert type(turn.log_probs[1]) is float


def test_an_answer_without_log_probs_gives_its_output_ids():
    info = {"finish_reason": "stop"}
    turn = parse_engine_output({"meta_info": info, "output_ids": [5, 6]}, False)
    assert turn == Turn([5, 6], "stop", meta_info=info, versions=[(0, 2, None)])


def test_keys_the_reader_does_not_know_are_left_alone():
    info = {"finish_reason": {"type": "stop", "matched": 9}, "output_token_logprobs": [[-0.5, 5, "x"]]}
    info.update(
        e2e_latency=0.1, num_retractions=2, reasoning_tokens=0, cached_tokens_details={"device": 3}, new_key=[]
    )
    turn = parse_engine_output({"meta_info": info, "output_ids": [5], "prompt_token_ids": [1], "extra": 1}, True)
    assert turn.ids == [5] and turn.meta_info is info


def test_an_aborted_answer_keeps_what_was_sampled_before_the_abort():
    pairs = [[-0.5, 5, None], [-0.25, 6, None]]
    info = {"finish_reason": {"type": "abort"}, "output_token_logprobs": pairs}
    assert parse_engine_output({"meta_info": info}, True) == Turn(
        [5, 6], "abort", log_probs=[-0.5, -0.25], meta_info=info, versions=[(0, 2, None)]
    )
    info = {"finish_reason": {"type": "abort"}, "output_token_logprobs": None}
    assert parse_engine_output({"meta_info": info}, True) == Turn([], "abort", log_probs=[], meta_info=info)
    info = {"finish_reason": {"type": "abort"}}
    assert parse_engine_output({"meta_info": info, "output_ids": [5]}, False).ids == [5]
    assert parse_engine_output({"meta_info": info, "output_ids": None}, False) == Turn([], "abort", meta_info=info)
    assert parse_engine_output({"meta_info": info}, False) == Turn([], "abort", meta_info=info)


@pytest.mark.parametrize("return_logprob", [True, False], ids=["log-probs", "ids"])
def test_a_request_aborted_while_waiting_answers_nothing_and_is_accepted(return_logprob):
    # managers/tokenizer_manager.py _handle_abort_req: no prompt_tokens, no cached_tokens, no tokens
    info = {"id": "r", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}}
    info.update(weight_version="3", e2e_latency=0.0, completion_tokens=0)
    if return_logprob:
        info.update(input_token_logprobs=[], output_token_logprobs=[], output_token_logprobs_length=0)
    turn = parse_engine_output({"text": "", "output_ids": [], "meta_info": info}, return_logprob)
    assert turn.ids == [] and turn.finish_type == "abort" and turn.versions == []


@pytest.mark.parametrize(
    ("output", "return_logprob", "message"),
    [
        ([1, 2], False, r"^/generate answered without meta_info: \[1, 2\]$"),
        ({"text": "x" * 300}, False, r"^/generate answered without meta_info: \{'text': 'x{190}$"),
        ({"meta_info": "stop"}, True, r"^/generate answered without meta_info: \{'meta_info': 'stop'\}$"),
        (
            {"meta_info": {"finish_reason": {"type": "stop"}}, "output_ids": [1]},
            True,
            r"^/generate answered without meta_info\.output_token_logprobs$",
        ),
        (
            {"meta_info": {"finish_reason": {"type": "stop"}}},
            False,
            r"^/generate answered without output_ids; this SGLang version only returns generated ids with log probs, "
            r"so set TRACK_LOG_PROBS=true \(re-tokenizing the text would not be token-exact\)$",
        ),
    ],
)
def test_an_answer_without_what_exact_training_needs_is_refused(output, return_logprob, message):
    with pytest.raises(EngineProtocolError, match=message):
        parse_engine_output(output, return_logprob)


NOT_A_PAIR = r"not \[logprob, token id, text\]"


def stop(pairs, **info) -> dict:
    return {"meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": pairs, **info}}


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            stop([[-0.5, 5, None], [None, 6, None]]),
            r"^the engine's log prob of output token 1 \(id 6\) is null: SGLang sends a NaN or infinite log prob as "
            r"null, so the policy's numbers are broken \(check the model's weights, or run with TRACK_LOG_PROBS=false "
            r"to let slime recompute them\)$",
        ),
        (stop([[math.inf, 5, None]]), r"^output_token_logprobs\[0\] has log prob inf, not a finite number$"),
        (stop([[math.nan, 5, None]]), r"^output_token_logprobs\[0\] has log prob nan, not a finite number$"),
        (stop([[True, 5, None]]), r"^output_token_logprobs\[0\] has log prob True, not a finite number$"),
        (stop([["-0.5", 5, None]]), r"^output_token_logprobs\[0\] has log prob '-0.5', not a finite number$"),
        (
            stop([[-0.5, "5", None]]),
            r"^output_token_logprobs\[0\] is \[-0.5, '5', None\], not \[logprob, token id, text\]$",
        ),
        (
            stop([[-0.5, 5.0, None]]),
            r"^output_token_logprobs\[0\] is \[-0.5, 5.0, None\], not \[logprob, token id, text\]$",
        ),
        (stop([[-0.5]]), r"^output_token_logprobs\[0\] is \[-0.5\], not \[logprob, token id, text\]$"),
        (stop("[[-0.5, 5]]"), r"^/generate answered output_token_logprobs \[\[-0.5, 5\]\], not a list$"),
        (
            {**stop([[-0.5, 5, None], [-0.5, 6, None]]), "output_ids": [5]},
            r"^/generate answered 1 output_ids and 2 output_token_logprobs that disagree: the sampled ids are "
            r"ambiguous$",
        ),
        (
            {**stop([[-0.5, 5, None]]), "output_ids": [6]},
            r"^/generate answered 1 output_ids and 1 output_token_logprobs that disagree",
        ),
        ({**stop([]), "output_ids": ["5"]}, r"^/generate answered output_ids \['5'\], not a list of token ids$"),
        (
            {"meta_info": {"output_token_logprobs": []}},
            r"^/generate answered finish_reason None; accepted: a type of stop, length, abort$",
        ),
        (
            {"meta_info": {"finish_reason": {"type": "cancelled"}, "output_token_logprobs": []}},
            r"^/generate answered finish_reason \{'type': 'cancelled'\}; accepted: a type of stop, length, abort$",
        ),
    ],
)
def test_an_answer_with_broken_values_is_refused_with_what_was_wrong(output, message):
    with pytest.raises(EngineProtocolError, match=message):
        parse_engine_output(output, True)


# ---- weight versions --------------------------------------------------------------------------------------------


def test_sglang_0_5_23_spans_give_each_token_its_version():
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    assert read_weight_versions({"weight_version": "4", "weight_versions": spans}, 5) == [(0, 2, "3"), (2, 5, "4")]
    # one span of 0 tokens (a request that sampled nothing), and empty spans between, are dropped
    assert read_weight_versions({"weight_versions": [{"version": "3", "start": 0, "end": 0}]}, 0) == []
    middle = [
        {"version": 1, "start": 0, "end": 1},
        {"version": 2, "start": 1, "end": 1},
        {"version": 3, "start": 1, "end": 2},
    ]
    assert read_weight_versions({"weight_versions": middle}, 2) == [(0, 1, "1"), (1, 2, "3")]


def test_without_spans_an_answer_is_one_span_of_its_weight_version():
    assert read_weight_versions({"weight_version": "7"}, 3) == [(0, 3, "7")]
    assert read_weight_versions({}, 2) == [(0, 2, None)]
    assert read_weight_versions({"weight_version": "7"}, 0) == []


@pytest.mark.parametrize(
    "spans",
    [
        [{"version": "3", "start": 0, "end": 2}],  # short of the tokens
        [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 3, "end": 5}],  # a gap
        [{"version": "3", "start": 1, "end": 5}],  # not from the first token
        [{"version": "3", "start": 0, "end": 6}],  # past the tokens
        [{"start": 0, "end": 5}],  # no version
        [{"version": "3", "start": 0, "end": "5"}],
        [["3", 0, 5]],
        "3",
    ],
)
def test_spans_that_do_not_tile_the_tokens_are_refused(spans):
    with pytest.raises(EngineProtocolError, match="meta_info.weight_versions .* cover"):
        read_weight_versions({"weight_versions": spans}, 5)


def test_the_newest_version_the_engines_showed_only_grows_and_skips_unordered_ones():
    versions = EngineVersions()
    assert versions.newest is None
    versions.observe(["default", None])
    assert versions.newest is None
    versions.observe(["000012", "3"])
    versions.observe(["5"])
    assert versions.newest == 12
    versions.forget()
    assert versions.newest is None


def test_the_weight_version_is_sglangs_as_a_string():
    assert engine.weight_version_of({"weight_version": 7}) == "7"
    assert engine.weight_version_of({"weight_version": "default"}) == "default"
    assert engine.weight_version_of({}) is None
    assert engine.weight_version_of(None) is None


# ---- the /generate call -----------------------------------------------------------------------------------------


class RecordedEngine:
    """Stands in for the POST: records each request and answers from a list, the last answer repeating (an
    exception is raised)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def next_answer(self):
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def post_json(self, session, url, payload, timeout, **kwargs):
        self.calls.append(dict(session=session, url=url, payload=payload, timeout=timeout, **kwargs))
        return self.next_answer()

    async def post(self, url, payload, max_retries=60, headers=None):
        self.calls.append(dict(url=url, payload=payload, max_retries=max_retries, headers=headers))
        return self.next_answer()


def answer(ids, finish="stop", prompt_tokens=None, **info):
    meta_info = {"finish_reason": {"type": finish}, "output_token_logprobs": [[-0.5, i, None] for i in ids], **info}
    if prompt_tokens is not None:
        meta_info["prompt_tokens"] = prompt_tokens
    return {"meta_info": meta_info, "output_ids": list(ids)}


@pytest.fixture
def sglang(monkeypatch):
    """The engine behind post_with_retries and slime's post() (this module's, no server); retries do not wait."""
    sglang = RecordedEngine(answer([5]))
    waits, real_wait_fixed = [], engine.wait_fixed

    def wait_fixed(seconds):
        waits.append(seconds)
        return real_wait_fixed(0)

    monkeypatch.setattr(engine, "post_json", sglang.post_json)
    monkeypatch.setattr(engine, "slime_post", sglang.post)
    monkeypatch.setattr(engine, "wait_fixed", wait_fixed)
    sglang.waits = waits
    return sglang


async def test_a_turn_is_one_generate_call_with_the_ids_the_sampling_params_and_the_log_prob_flag(sglang):
    sglang.answers = [answer([5, 6], prompt_tokens=3)]
    turn = await engine.generate_turn("http://e/generate", [1, 2, 3], {"temperature": 1.0}, True, headers={"h": "v"})
    assert turn.ids == [5, 6] and turn.log_probs == [-0.5, -0.5] and turn.finish_type == "stop"
    (call,) = sglang.calls
    assert call["url"] == "http://e/generate"
    assert call["payload"] == {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 1.0}, "return_logprob": True}
    assert call["timeout"] is None  # a long generation is not cut off by a client timeout
    assert call["headers"] == {"h": "v"}
    assert call["session"] is engine.unbounded_session("sglang")
    assert sglang.waits == [1.0]


async def test_slimes_post_carries_the_call_when_asked(sglang):
    sglang.answers = [answer([5], prompt_tokens=2)]
    turn = await engine.generate_turn("http://e/generate", [1, 2], {}, False, use_slime_post=True, headers={"k": "1"})
    assert turn == Turn([5], "stop", meta_info=sglang.answers[0]["meta_info"], versions=[(0, 1, None)])
    assert sglang.calls == [
        {
            "url": "http://e/generate",
            "payload": {"input_ids": [1, 2], "sampling_params": {}, "return_logprob": False},
            "max_retries": 1,  # the retries are post_with_retries': slime's own would retry a 4xx 60 times
            "headers": {"k": "1"},
        }
    ]


async def test_an_engine_that_conditioned_on_other_tokens_than_were_sent_is_refused(sglang):
    sglang.answers = [answer([5], prompt_tokens=4)]
    message = (
        r"^the engine conditioned on 4 tokens but 3 were sent, so the trajectory would not be what it saw: something "
        r"rewrote or truncated input_ids \(the old slime router's radix middleware rewrites them: use "
        r"TOKEN_TRACKING_MODE=router_radix with it; SGLang's allow_auto_truncate cuts them\)$"
    )
    with pytest.raises(EngineProtocolError, match=message):
        await engine.generate_turn("http://e/generate", [1, 2, 3], {}, True)
    # an aborted answer is resumed from its tokens: what it conditioned on is checked too (allow_auto_truncate)
    sglang.answers = [answer([5], "abort", prompt_tokens=2)]
    with pytest.raises(EngineProtocolError, match=r"^the engine conditioned on 2 tokens but 3 were sent"):
        await engine.generate_turn("http://e/generate", [1, 2, 3], {}, True)
    # an abort before prefill reports 0 prompt tokens on some SGLang versions; a count that is no int is no claim
    for reply in (answer([], "abort", prompt_tokens=0), answer([5], prompt_tokens="3"), answer([5])):
        sglang.answers = [reply]
        await engine.generate_turn("http://e/generate", [1, 2, 3], {}, True)


async def test_an_engine_that_is_down_is_retried_60_times_1_s_apart_then_reported(sglang, caplog):
    sglang.answers = [RetryableRequestFailed("http://e/generate: ClientConnectorError: refused\n(errno 111)")]
    message = r"^no SGLang engine reachable at http://e/generate after 60 attempts: .*refused \(errno 111\)$"
    with caplog.at_level(logging.WARNING, logger=engine.logger.name):
        with pytest.raises(EngineUnavailable, match=message) as raised:
            await engine.generate_turn("http://e/generate", [1], {}, True)
    assert "\n" not in str(raised.value) and raised.value.__cause__ is None  # one line, nothing chained
    assert len(sglang.calls) == 60
    assert sglang.waits == [1.0]
    retries = [r for r in caplog.records if r.name == engine.logger.name and r.levelno == logging.WARNING]
    assert len(retries) == 59 and "refused" in retries[0].getMessage()


async def test_an_engine_that_answers_errors_to_every_attempt_fails_the_sample_not_the_rollout(sglang):
    sglang.answers = [RetryableRequestFailed("http://e/generate answered HTTP 503: busy", status=503)]
    with pytest.raises(EngineProtocolError, match=r"^the engine answered errors to all 60 attempts: .* 503: busy$"):
        await engine.generate_turn("http://e/generate", [1], {}, True)
    assert len(sglang.calls) == 60


async def test_an_engine_that_recovers_answers_the_same_call(sglang):
    sglang.answers = [RetryableRequestFailed("HTTP 503"), RetryableRequestFailed("HTTP 429"), answer([5])]
    turn = await engine.generate_turn("http://e/generate", [1], {}, True)
    assert turn.ids == [5] and len(sglang.calls) == 3


async def test_a_rejected_request_is_not_retried(sglang):
    sglang.answers = [RequestFailed("http://e/generate rejected the request with HTTP 400: bad")]
    with pytest.raises(EngineProtocolError, match=r"^http://e/generate rejected the request with HTTP 400: bad$"):
        await engine.generate_turn("http://e/generate", [1], {}, True)
    assert len(sglang.calls) == 1


async def test_every_answer_tells_the_newest_version_the_engines_have(sglang):
    spans = [{"version": "5", "start": 0, "end": 1}, {"version": "6", "start": 1, "end": 2}]
    sglang.answers = [answer([5, 6], weight_version="6", weight_versions=spans)]
    await engine.generate_turn("http://e/generate", [1], {}, True)
    assert ENGINE_VERSIONS.newest == 6
    # an abort that sampled nothing still says which weights the engine holds
    sglang.answers = [answer([], "abort", weight_version="7")]
    await engine.generate_turn("http://e/generate", [1], {}, True)
    assert ENGINE_VERSIONS.newest == 7
    sglang.answers = [answer([5], weight_version="default")]
    await engine.generate_turn("http://e/generate", [1], {}, True)
    assert ENGINE_VERSIONS.newest == 7


async def test_slimes_post_that_reaches_no_engine_is_retried_then_reported(sglang):
    sglang.answers = [RuntimeError("connection refused")]
    message = r"^no SGLang engine reachable at http://e/generate after 60 attempts: .*: connection refused$"
    with pytest.raises(EngineUnavailable, match=message):
        await engine.generate_turn("http://e/generate", [1], {}, True, use_slime_post=True)
    assert len(sglang.calls) == 60 and {call["max_retries"] for call in sglang.calls} == {1}
