"""The token-exactness invariants every trajectory must satisfy, checked against the engine's own record."""

from support.episodes import info, searches
from support.fake_sglang import EngineCall


def assert_faithful(
    sample,
    calls: list[EngineCall],
    tokenizer,
    prompt_ids: list[int],
    *,
    track_log_probs: bool = True,
    train_observations: bool = False,
    allow_cut: bool = False,
    canonical_observations: bool = False,
) -> None:
    """Check `sample` against the engine calls made for it.

    - every id the engine conditioned on is a prefix of sample.tokens, and tokens = prompt + response;
    - each turn's sampled ids sit right after its context with mask 1 and the engine's log probs
      (all of them, unless `allow_cut`: an engine that ran past a stop string may be cut after it);
    - every other response position is an observation: mask 0 (1 when trained) and log prob 0.0;
    - len(loss_mask) == len(rollout_log_probs) == response_length; decode(response ids) == response;
    - with `canonical_observations`: every run of observation ids is the tokenizer's own tokenization of its text
      (see assert_canonical_observation).
    """
    tokens, prompt_length = sample.tokens, len(prompt_ids)
    response_ids = tokens[prompt_length:]
    assert tokens[:prompt_length] == prompt_ids, "sample.tokens does not start with the prompt ids"
    assert sample.response_length == len(response_ids)
    assert len(sample.loss_mask) == sample.response_length
    if track_log_probs:
        assert sample.rollout_log_probs is not None
        assert len(sample.rollout_log_probs) == sample.response_length
    else:
        assert sample.rollout_log_probs is None
    assert tokenizer.decode(response_ids, skip_special_tokens=False) == sample.response

    generated = [False] * len(response_ids)
    previous_end = 0
    for call in calls:
        assert not call.sent_text, "the engine was sent text instead of token ids"
        context = call.input_ids
        assert tokens[: len(context)] == context, "the engine conditioned on ids that are not a prefix of tokens"
        start = len(context) - prompt_length
        assert start >= previous_end, "an engine call overlaps the previous turn's tokens"
        kept = 0
        while kept < len(call.output_ids) and start + kept < len(response_ids):
            if response_ids[start + kept] != call.output_ids[kept]:
                break
            kept += 1
        if not allow_cut and call.finish.get("type") != "abort":
            assert kept == len(call.output_ids), f"turn sampled {len(call.output_ids)} ids but {kept} were kept"
        for offset in range(kept):
            position = start + offset
            generated[position] = True
            assert sample.loss_mask[position] == 1, f"sampled token at {position} has loss mask 0"
            if track_log_probs:
                assert sample.rollout_log_probs[position] == call.log_probs[offset], f"log prob differs at {position}"
        previous_end = start + kept

    observation_mask = 1 if train_observations else 0
    for position, is_generated in enumerate(generated):
        if is_generated:
            continue
        assert sample.loss_mask[position] == observation_mask, f"observation token at {position} has the wrong mask"
        if track_log_probs:
            assert sample.rollout_log_probs[position] == 0.0, f"observation token at {position} has a log prob"

    if canonical_observations:
        run: list[int] = []
        for token, is_generated in zip([*response_ids, None], [*generated, True], strict=True):
            if is_generated:
                if run:
                    assert_canonical_observation(run, tokenizer)
                run = []
            else:
                run.append(token)


def assert_canonical_observation(ids: list[int], tokenizer) -> None:
    """`ids` are what tokenizing their text gives, as a chat server tokenizes a rendered conversation: split at
    the added tokens (the template's <|im_start|>, <|im_end|>, ...) and nowhere else; between them, the text is
    tokenized as one string, with anything that merely looks like a special token kept as text."""
    added = set(tokenizer.get_added_vocab().values())
    segment: list[int] = []
    for token in [*ids, None]:
        if token is not None and token not in added:
            segment.append(token)
            continue
        if segment:
            text = tokenizer.decode(segment, skip_special_tokens=False)
            canonical = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            assert segment == canonical, (
                f"observation text {text!r} was tokenized as {tokenizer.convert_ids_to_tokens(segment)}, "
                f"not as {tokenizer.convert_ids_to_tokens(canonical)}"
            )
        segment = []


def assert_resumed_exactly(resumed, baseline, masked_before: int | None = None) -> None:
    """An episode an abort interrupted (resumed, or started over) is the uninterrupted one, token for token;
    `masked_before`: slime masked the first that many response tokens out of the loss when the sample came back
    (--mask-offpolicy-in-partial-rollout)."""
    assert resumed.status == baseline.status
    assert resumed.tokens == baseline.tokens
    assert resumed.response == baseline.response
    assert resumed.rollout_log_probs == baseline.rollout_log_probs
    expected_mask = list(baseline.loss_mask)
    if masked_before is not None:
        expected_mask[:masked_before] = [0] * masked_before
    assert resumed.loss_mask == expected_mask
    assert resumed.reward == baseline.reward
    for key in ("turns", "generated_tokens", "finish_reason"):
        assert info(resumed)[key] == info(baseline)[key]
    assert searches(resumed) == searches(baseline)
