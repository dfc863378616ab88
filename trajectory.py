"""Record a multi-turn trajectory on a slime Sample with tokens, loss mask and log probs kept aligned."""

from dataclasses import asdict, dataclass, field

from slime.utils.types import Sample

METADATA_KEY = "search_r1"


@dataclass
class EpisodeStats:
    """Per-sample counters, stored in sample.metadata["search_r1"] for plotting (search_metrics.py reads them)."""

    turns: int = 0
    searches: int = 0
    search_failures: int = 0
    search_seconds: float = 0.0
    search_latencies: list[float] = field(default_factory=list)  # seconds of each search call, failed ones too
    invalid_actions: int = 0  # finished turns with neither a usable search nor an answer
    observation_tokens: int = 0
    truncated_observations: int = 0
    finish_reason: str = ""
    evaluation: bool = False
    search_error: str | None = None


class Trajectory:
    """Owns the response side of `sample` for one generate() call.

    Model tokens always get loss mask 1 and the engine's log probs. Observation tokens get mask 0,
    or 1 when `train_observations` (LOSS_MASK_MODE=simple); their log probs are 0.0 placeholders
    because the engine never sampled them. With log probs tracked, slime's append_response_tokens
    does the bookkeeping; without, rollout_log_probs stays None and slime recomputes them.
    """

    def __init__(
        self, args, sample: Sample, prompt_ids: list[int], *, track_log_probs: bool, train_observations: bool
    ):
        self.args = args
        self.sample = sample
        self.prompt_length = len(prompt_ids)
        self.track_log_probs = track_log_probs
        self.train_observations = train_observations
        self.stats = EpisodeStats()
        reset_response_fields(sample, prompt_ids, track_log_probs)

    @property
    def response_length(self) -> int:
        return self.sample.response_length

    @property
    def context_length(self) -> int:
        return len(self.sample.tokens)

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

    def finish(self, status: Sample.Status, reason: str, tokenizer) -> Sample:
        sample = self.sample
        sample.response = tokenizer.decode(sample.tokens[self.prompt_length :], skip_special_tokens=False)
        return record_finish(sample, self.stats, status, reason)


def record_finish(sample: Sample, stats: EpisodeStats, status: Sample.Status, reason: str) -> Sample:
    sample.status = status
    stats.finish_reason = reason
    sample.metadata[METADATA_KEY] = asdict(stats)
    return sample


def reset_response_fields(sample: Sample, prompt_ids: list[int], track_log_probs: bool) -> None:
    """slime may call generate() again on the same Sample (retry, partial rollout): start clean."""
    sample.tokens = list(prompt_ids)
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = []
    sample.rollout_log_probs = [] if track_log_probs else None
    sample.rollout_top_p_token_ids = None
    sample.rollout_top_p_token_offsets = None
    if hasattr(sample, "rollout_routed_experts"):
        sample.rollout_routed_experts = None
    sample.weight_versions = []
    for name in ("prefix_cache_info", "spec_info"):  # slime adds every turn's meta_info to these
        if hasattr(sample, name):
            setattr(sample, name, type(getattr(sample, name))())
    sample.reward = None
    sample.remove_sample = False
    sample.status = Sample.Status.PENDING
    sample.metadata = {k: v for k, v in (sample.metadata or {}).items() if k != METADATA_KEY}
