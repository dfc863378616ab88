"""The trajectory on a slime Sample: tokens, loss mask and log probs, kept aligned; the only writer of those fields.

Model tokens always get loss mask 1 and the engine's log probs. Observation tokens get mask 0, or 1 when
`train_observations` (LOSS_MASK_MODE=simple); their log probs are 0.0 placeholders because the engine never
sampled them. With log probs tracked, slime's append_response_tokens does the bookkeeping; without,
rollout_log_probs stays None and slime recomputes them.
"""

from slime.utils.types import Sample
from slime_search_r1.record import forget_episode


class Trajectory:
    """Owns the response side of `sample` for one generate() call: reset on creation (slime may retry a Sample), or,
    for a partial rollout's aborted sample, continued as slime left it (loss mask off-policy-masked or not)."""

    def __init__(
        self,
        args,
        sample: Sample,
        prompt_ids: list[int],
        *,
        track_log_probs: bool,
        train_observations: bool,
        continued: bool = False,
    ):
        self.args = args
        self.sample = sample
        self.prompt_ids = list(prompt_ids)
        self.track_log_probs = track_log_probs
        self.train_observations = train_observations
        if continued:
            sample.reward, sample.remove_sample, sample.status = None, False, Sample.Status.PENDING
        else:
            reset_response_fields(sample, prompt_ids, track_log_probs)

    @property
    def response_length(self) -> int:
        return self.sample.response_length

    @property
    def context_length(self) -> int:
        return len(self.sample.tokens)

    def response_ids(self) -> list[int]:
        return self.sample.tokens[len(self.prompt_ids) :]

    def add_generated(self, ids: list[int], log_probs: list[float] | None, meta_info: dict | None) -> None:
        if self.track_log_probs:
            self.sample.append_response_tokens(
                self.args, tokens=ids, log_probs=log_probs, trainable=True, meta_info=meta_info
            )
        else:
            self._extend_untracked(ids, 1)

    def add_observation(self, ids: list[int]) -> None:
        if not self.track_log_probs:
            self._extend_untracked(ids, 1 if self.train_observations else 0)
        elif self.train_observations:
            self.sample.append_response_tokens(self.args, tokens=ids, log_probs=[0.0] * len(ids), trainable=True)
        else:
            self.sample.append_response_tokens(self.args, tokens=ids, trainable=False)

    def _extend_untracked(self, ids: list[int], mask: int) -> None:
        # append_response_tokens insists on log probs for trainable tokens, so do its bookkeeping here.
        self.sample.tokens += ids
        self.sample.response_length += len(ids)
        self.sample.loss_mask += [mask] * len(ids)

    def replace_response(self, ids: list[int], loss_mask: list[int], log_probs: list[float] | None) -> None:
        """The whole response at once, as a router's cache recorded it (the router token-tracking modes)."""
        reset_response_fields(self.sample, self.prompt_ids + list(ids), self.track_log_probs)
        self.sample.response_length = len(ids)
        self.sample.loss_mask = [1] * len(ids) if self.train_observations else [int(m) for m in loss_mask]
        if self.track_log_probs:
            self.sample.rollout_log_probs = [float(v) for v in log_probs]

    def decode_response(self, tokenizer) -> None:
        self.sample.response = tokenizer.decode(self.sample.tokens[len(self.prompt_ids) :], skip_special_tokens=False)


def why_not_continued(sample: Sample, prompt_ids: list[int], track_log_probs: bool) -> str | None:
    """Why the sample's response fields cannot be continued as they are (None: they can): a prompt that renders
    differently now, or fields that do not line up."""
    response_length = sample.response_length
    if list(sample.tokens[: len(prompt_ids)]) != list(prompt_ids):
        return "its tokens do not start with the prompt's tokens as they render now"
    if len(sample.tokens) != len(prompt_ids) + response_length:
        return f"{len(sample.tokens)} tokens for {len(prompt_ids)} of prompt and {response_length} of response"
    if len(sample.loss_mask or []) != response_length:
        return f"a loss mask of {len(sample.loss_mask or [])} for {response_length} response tokens"
    log_probs = sample.rollout_log_probs
    if track_log_probs and (log_probs is None or len(log_probs) != response_length):
        return f"{'no' if log_probs is None else len(log_probs)} rollout log probs for {response_length} tokens"
    return None


def reset_response_fields(sample: Sample, tokens: list[int], track_log_probs: bool) -> None:
    """slime may call generate() again on the same Sample (retry, partial rollout): start clean."""
    sample.tokens = list(tokens)
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = []
    sample.rollout_log_probs = [] if track_log_probs else None
    sample.rollout_top_p_token_ids = None
    sample.rollout_top_p_token_offsets = None
    sample.rollout_routed_experts = None
    sample.weight_versions = []
    sample.prefix_cache_info = type(sample.prefix_cache_info)()  # slime adds every turn's meta_info to these
    sample.spec_info = type(sample.spec_info)()
    sample.reward = None
    sample.remove_sample = False
    sample.status = Sample.Status.PENDING
    forget_episode(sample)
