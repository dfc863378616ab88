"""How SGLang decides where a /generate request ends, and what its answer holds, read from SGLang's own source.

Both scripted engines generate with these rules: the stand-in anyone can serve (server.py) and the test suite's
(tests/support/fake_sglang.py). Each rule names the SGLang version and the file it was read from (paths inside the
wheel, under sglang/srt/; `pip download sglang==0.5.23 --no-deps` and unzip to check). Two versions are covered:
0.5.15.post1, what slime's Docker image runs, and 0.5.23, the newest on the index. They differ in the order of the
finish checks and in what an answer says about weight versions.
"""

from dataclasses import dataclass, field

SGLANG_0_5_15 = "0.5.15.post1"
SGLANG_0_5_23 = "0.5.23"
VERSIONS = (SGLANG_0_5_15, SGLANG_0_5_23)

# FINISH_ABORT() of a running request carries SGLang's default message (managers/schedule_batch.py, FINISH_ABORT).
RUNNING_ABORT = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# A request still in the waiting queue is answered by the tokenizer manager's _handle_abort_req, whose fallback
# message this is (managers/tokenizer_manager.py, both versions).
WAITING_ABORT = {"type": "abort", "message": "Abort in waiting queue"}


@dataclass
class FinishRules:
    """What may end one request: its sampling params (stop strings, stop_token_ids, max_new_tokens, ignore_eos) and
    the served model's EOS set (model config ∪ generation config ∪ tokenizer: for the base Qwen2.5-3B only
    <|endoftext|>)."""

    version: str
    decode: object  # ids -> text, as SGLang's tail_str decodes (special tokens kept)
    stop_strs: list[str]
    stop_str_max_len: int  # the most tokens a stop string encodes to on its own (SamplingParams.normalize)
    stop_token_ids: set[int]
    eos_token_ids: set[int]
    ignore_eos: bool
    max_new_tokens: int

    @classmethod
    def of(cls, version: str, decode, params: dict, eos_token_ids, encode=None) -> "FinishRules":
        """`encode`: text -> ids without special tokens (the stop strings' canonical token counts); without it each
        stop string counts as many tokens as it has characters (SGLang's fallback without a tokenizer)."""
        stops = params.get("stop") or []
        stop_strs = [stops] if isinstance(stops, str) else list(stops)
        return cls(
            version=version,
            decode=decode,
            stop_strs=stop_strs,
            stop_str_max_len=max((len(encode(s) if encode else s) for s in stop_strs), default=0),
            stop_token_ids=set(params.get("stop_token_ids") or []),
            eos_token_ids=set(eos_token_ids),
            ignore_eos=bool(params.get("ignore_eos")),
            max_new_tokens=int(params.get("max_new_tokens", 128)),
        )

    def check(self, out: list[int], accepted: int) -> tuple[dict, int] | None:
        """Req.update_finish_state after `accepted` new tokens were appended to `out` (one per decode step; several in
        an accepted speculative run): (finish_reason, how many tokens the answer keeps), or None to go on.

        0.5.23 (managers/schedule_batch.py, update_finish_state): stop string, then stop token / EOS, each capped at
        max_new_tokens (_cap_finished_len_at_max_new_tokens), then length. 0.5.15.post1 (same file): length first, then
        stop string, then stop token / EOS. So at the last allowed token that completes a stop, 0.5.23 says stop and
        0.5.15.post1 says length. In both, a stop string completed later in one accepted run wins over an EOS earlier
        in it, so that EOS stays inside output_ids."""
        length = ({"type": "length", "length": self.max_new_tokens}, self.max_new_tokens)
        if self.version == SGLANG_0_5_15 and len(out) >= self.max_new_tokens:
            return length
        found = self._stop_string(out, accepted) or self._stop_token(out, accepted)
        if found is not None:
            if self.version == SGLANG_0_5_23 and found[1] > self.max_new_tokens:
                return length
            return found
        if len(out) >= self.max_new_tokens:
            return length
        return None

    def _stop_string(self, out: list[int], accepted: int) -> tuple[dict, int] | None:
        """_check_str_based_finish: the first stop string in the tail window of this request's output; the answer
        ends at the token that completes it (_locate_str_stop_finished_len), which may carry characters past it.

        The window (Req._stop_match_tail_len, both versions) is the last stop_str_max_len + 1 output tokens, plus
        the other tokens accepted in this step: a stop string written in more tokens than that (a non-canonical
        tokenization of `</search>`) is never seen, nor one split across an abort and its resume (a new request).
        Req.decoded_text, which the check also reads, stays "" in the scheduler (only the detokenizer decodes)."""
        if not self.stop_strs:
            return None
        window = min(self.stop_str_max_len + 1 + max(accepted - 1, 0), len(out))
        start = len(out) - window
        tail = self.decode(out[start:])
        for stop in self.stop_strs:
            if stop in tail:
                for count in range(max(1, window - accepted + 1), window):
                    if stop in self.decode(out[start : start + count]):
                        return {"type": "stop", "matched": stop}, start + count
                return {"type": "stop", "matched": stop}, len(out)
        return None

    def _stop_token(self, out: list[int], accepted: int) -> tuple[dict, int] | None:
        """_check_token_based_finish: the first new token in stop_token_ids or the EOS set (none with ignore_eos,
        which turns off stop_token_ids too); the matched id stays in output_ids."""
        if self.ignore_eos:
            return None
        for position in range(len(out) - accepted, len(out)):
            token = out[position]
            if token in self.stop_token_ids or token in self.eos_token_ids:
                return {"type": "stop", "matched": token}, position + 1
        return None


@dataclass
class Decoded:
    """One request's output: its ids, how it ended, and the weight versions that sampled its tokens."""

    ids: list[int] = field(default_factory=list)
    finish: dict = field(default_factory=dict)
    # [version, start, end] spans over ids (0.5.23's meta_info.weight_versions); one span unless the weights changed
    # while it ran without aborting it (an in-place or retracting pause)
    spans: list[list] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return bool(self.finish)


def decode_steps(plan: list[int], rules: FinishRules, *, run: int = 1, until: int | None = None, out=None) -> Decoded:
    """Decode steps over the tokens the model would write (`plan`), `run` tokens accepted per step (speculative
    decoding), each step checked by `rules`; stops at the finish, or once `until` tokens are out (the request is
    still running then). A plan that runs out ends by length where it stands (the scripted model has no more)."""
    result = Decoded(ids=list(out or []))
    while not result.finished:
        if until is not None and len(result.ids) >= until:
            return result
        accepted = plan[len(result.ids) : len(result.ids) + run]
        if not accepted:
            result.finish = {"type": "length", "length": rules.max_new_tokens}
            return result
        result.ids.extend(accepted)
        found = rules.check(result.ids, len(accepted))
        if found is not None:
            result.finish, kept = found
            del result.ids[kept:]
    return result


def abort_running(plan: list[int], decoded: Decoded, max_new_tokens: int, *, run: int = 1) -> Decoded:
    """A running request that an abort reaches (POST /abort_request, or /pause_generation in its default "abort"
    mode): the scheduler sets req.to_finish (managers/scheduler.py, abort_request, "Abort method 3"), the request runs
    one more decode step, and update_finish_state takes to_finish before any check (managers/schedule_batch.py,
    both versions). So the answer holds one more step's tokens, appended with NO stop check: it can end with the EOS,
    <|im_end|>, or the token that completes a stop string, under finish_reason abort."""
    extra = plan[len(decoded.ids) : min(len(decoded.ids) + run, max_new_tokens)]
    return Decoded(ids=decoded.ids + extra, finish=dict(RUNNING_ABORT), spans=decoded.spans)


def weight_version_spans(events: list[tuple[str, int]], current: str, count: int) -> list[dict]:
    """0.5.23's meta_info.weight_versions (utils/weight_versions.py, compute_weight_version_spans then
    add_weight_versions_to_meta_info): `events` are (old version, output tokens when it changed); spans of equal
    versions merge, and a request with no output has one empty span."""
    spans: list[dict] = []
    for version, end in [*events, (current, count)]:
        end = min(end, count)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and version == spans[-1]["version"]:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return [span for span in spans if span["start"] < count or span["start"] == 0]


def trimmed_text(text_of, ids: list[int], finish: dict, params: dict) -> str:
    """The answer's `text`: without no_stop_trim, a stop string is cut from it (with what followed in its token) and
    a matched stop token is left out; slime sends no_stop_trim, so it keeps everything."""
    text = text_of(ids)
    if params.get("no_stop_trim") or finish.get("type") != "stop":
        return text
    matched = finish.get("matched")
    if isinstance(matched, str):
        return text[: text.find(matched)] if matched in text else text
    return text_of(ids[:-1])


# ---- what a request may ask for ---------------------------------------------------------------------------------

# The keys of sampling_params that 0.5.23 accepts: _FIELDS_SamplingParams in sglang/api/v1/api_types.py (generated
# from the proto schema; SamplingParams there rejects unknown keys). 0.5.15.post1 has no such check.
SAMPLING_PARAMS_0_5_23 = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip


def unknown_sampling_field(version: str, params: dict) -> str | None:
    """0.5.23's refusal of an unknown sampling_params key, or None: the /generate route runs the schema check first
    (entrypoints/http_server.py generate_request -> entrypoints/api_contract.py generate_contract_error) and answers
    HTTP 400 with {"error": <text>}, the text a plain string as api_types.py's _unknown_field writes it (serde's)."""
    if version == SGLANG_0_5_15:
        return None
    for key in params:
        if key not in SAMPLING_PARAMS_0_5_23:
            listed = ", ".join(f"`{name}`" for name in SAMPLING_PARAMS_0_5_23)
            return f"unknown field `{key}`, expected one of {listed}"
    return None


@dataclass(frozen=True)
class LengthRules:
    """The length checks a /generate request meets, in their order; C is the served context length.

    1. The tokenizer manager (managers/tokenizer_manager.py, _validate_one_request, both versions) counts the input
       plus the slots EAGLE-style speculative decoding reserves (num_reserved_tokens: max(topk * num_steps,
       num_draft_tokens); 0 without it): input + reserved >= C is refused, and so is input + reserved +
       max_new_tokens > C.
    2. The scheduler (managers/scheduler.py, init_req_max_new_tokens) lowers max_new_tokens to C - 1 - input - 1
       without a word, then refuses an input of max_req_input_len = C - 6 tokens or more (managers/tp_worker.py:
       max_req_len = C - 1, max_req_input_len = max_req_len - 5; managers/utils.py validate_input_length).
    With --allow-auto-truncate each refusal cuts instead (the input to C, then to C - 6 tokens; max_new_tokens to
    C - input - reserved). A refusal is HTTP 400 with {"error": {"message": <text>}} (entrypoints/http_server.py,
    _create_error_response; the scheduler's refusal gets there through _handle_abort_finish_reason's ValueError).
    The KV pool is taken to hold a whole context (it caps both limits lower when it is smaller)."""

    context_length: int
    reserved: int = 0
    allow_auto_truncate: bool = False

    def admit(self, input_ids: list[int], max_new_tokens: int) -> tuple[str | None, list[int], int]:
        """(the refusal's message or None, the input the engine conditions on, the max_new_tokens it runs with)."""
        context, ids = self.context_length, list(input_ids)
        counted = len(ids) + self.reserved
        if counted >= context:
            if not self.allow_auto_truncate:
                return (
                    f"The input ({counted} tokens) is longer than the model's context length ({context} tokens).",
                    ids,
                    0,
                )
            del ids[context:]
            counted = len(ids)
        if counted + max_new_tokens > context:
            if not self.allow_auto_truncate:
                return (
                    "Requested token count exceeds the model's maximum context length "
                    f"of {context} tokens. You requested a total of {max_new_tokens + counted} "
                    f"tokens: {counted} tokens from the input messages and "
                    f"{max_new_tokens} tokens for the completion. Please reduce the number "
                    "of tokens in the input messages or the completion to fit within the limit.",
                    ids,
                    0,
                )
            max_new_tokens = max(0, context - counted)
        max_req_len = context - 1
        max_new_tokens = max(0, min(max_new_tokens, max_req_len - len(ids) - 1))
        max_req_input_len = max_req_len - 5
        if len(ids) >= max_req_input_len:
            if not self.allow_auto_truncate:
                return (
                    f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({max_req_input_len} "
                    "tokens). Use a shorter input or enable --allow-auto-truncate.",
                    ids,
                    0,
                )
            ids = ids[:max_req_input_len]
        return None, ids, max_new_tokens


# ---- a request retracted under memory pressure --------------------------------------------------------------------

# A non-streamed request's tokens reach the tokenizer manager every SGLANG_FORCE_STREAM_INTERVAL (50) tokens, and at
# its finish (managers/scheduler_components/output_streamer.py, accept; environ.py for the default).
FORCE_STREAM_INTERVAL = 50


def streamed_so_far(sampled: int) -> int:
    """How many of a running non-streamed request's `sampled` tokens the tokenizer manager holds: a request
    retracted to the waiting queue (managers/schedule_batch.py, retract_decode) and aborted there is answered from
    them by _handle_abort_req ("Abort in waiting queue", without prompt_tokens), its log probs alike."""
    return sampled - sampled % FORCE_STREAM_INTERVAL


def admit_request(
    version: str, input_ids: list[int], params: dict, lengths: LengthRules
) -> tuple[dict | None, list[int], int]:
    """(the HTTP 400 body SGLang refuses a /generate request with, or None; the input the engine conditions on; the
    max_new_tokens it runs with). In SGLang's order: 0.5.23's sampling_params schema (its error a plain string),
    max_new_tokens and min_new_tokens out of range (sampling/sampling_params.py, verify), then the length rules."""
    unknown = unknown_sampling_field(version, params)
    if unknown is not None:
        return {"error": unknown}, input_ids, 0
    max_new = params.get("max_new_tokens", 128)
    if not isinstance(max_new, int) or max_new < 0:
        return {"error": {"message": f"max_new_tokens must be >= 0, got {max_new}"}}, input_ids, 0
    min_new = params.get("min_new_tokens", 0)
    if not 0 <= min_new <= max_new:
        return (
            {"error": {"message": f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."}},
            [],
            0,
        )
    refusal, conditioned, max_new = lengths.admit(input_ids, max_new)
    if refusal is not None:
        return {"error": {"message": refusal}}, conditioned, 0
    return None, conditioned, max_new


def answer_meta(
    version: str,
    *,
    request_id: str,
    finish: dict,
    prompt_tokens: int,
    completion_tokens: int,
    weight_version: str,
    retractions: int = 0,
    version_events: list[tuple[str, int]] | None = None,
) -> dict:
    """The meta_info of a finished (or running, then aborted) request's answer (managers/tokenizer_manager.py,
    _handle_batch_output; 0.5.23 adds weight_versions, utils/weight_versions.py). Log probs are added apart
    (output_token_logprobs), only when the request asked for them."""
    meta = {
        "id": request_id,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "weight_version": weight_version,
        "num_retractions": retractions,
        "reasoning_tokens": 0,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
        "e2e_latency": 0.01,
    }
    if finish == WAITING_ABORT:  # _handle_abort_req answers from what it was sent (managers/tokenizer_manager.py)
        meta = {
            key: meta[key] for key in ("id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens")
        }
    if version != SGLANG_0_5_15:
        meta["weight_versions"] = weight_version_spans(version_events or [], weight_version, completion_tokens)
    return meta


def output_token_logprobs(log_probs: list[float | None], ids: list[int]) -> dict:
    """meta_info's log probs with return_logprob: [logprob, id, text] per output token, the text null as slime asks
    for none (return_text_in_logprobs off); a NaN log prob reaches the client as null (orjson writes NaN as null)."""
    return {
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(log_probs, ids, strict=True)],
        "output_token_logprobs_length": len(ids),
    }
