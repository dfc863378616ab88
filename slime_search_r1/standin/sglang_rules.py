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
    stop_token_ids: set[int]
    eos_token_ids: set[int]
    ignore_eos: bool
    max_new_tokens: int

    @classmethod
    def of(cls, version: str, decode, params: dict, eos_token_ids) -> "FinishRules":
        stops = params.get("stop") or []
        return cls(
            version=version,
            decode=decode,
            stop_strs=[stops] if isinstance(stops, str) else list(stops),
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
        """_check_str_based_finish: the first stop string in the output; the answer ends at the token that completes
        it (_locate_str_stop_finished_len), which may carry characters past it."""
        if not self.stop_strs:
            return None
        for stop in self.stop_strs:
            if stop in self.decode(out):
                for count in range(max(1, len(out) - accepted + 1), len(out) + 1):
                    if stop in self.decode(out[:count]):
                        return {"type": "stop", "matched": stop}, count
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


def request_error(prompt_tokens: int, params: dict, context_length: int) -> str | None:
    """Why SGLang refuses a /generate request with HTTP 400, or None: max_new_tokens and min_new_tokens out of range
    (sampling/sampling_params.py, verify), the prompt plus max_new_tokens past the context length
    (managers/tokenizer_manager.py, _validate_one_request)."""
    max_new = params.get("max_new_tokens", 128)
    if not isinstance(max_new, int) or max_new < 0:
        return f"max_new_tokens must be >= 0, got {max_new}"
    min_new = params.get("min_new_tokens", 0)
    if not 0 <= min_new <= max_new:
        return f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."
    if prompt_tokens + max_new > context_length:
        return (
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. You "
            f"requested a total of {prompt_tokens + max_new} tokens"
        )
    return None


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
