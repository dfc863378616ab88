"""TOKEN_TRACKING_MODE=manual: the exact id list being trained goes to SGLang's /generate, its ids and log probs come
back, and the trajectory on the sample grows by them, turn by turn.

  ManualDriver         the token driver: one engine call per turn (tokens/engine.py), its answer settled into the turn
                       it ends (tokens/engine_rules.py: an abort may already have ended it; an engine may run past
                       an end)
  Trajectory           the sample's tokens, loss mask and log probs, kept aligned: the only writer of those fields;
                       and which weight version sampled which tokens (the engine's spans, else one per engine call);
                       with split_trajectories, the segments an episode is trained as (one sample each)

Nothing is re-tokenized, so every id the engine conditioned on is a prefix of `sample.tokens` (of its segment's
tokens, once an episode is split). With slime's --partial-rollout a turn the engine aborted keeps what it had
sampled, and the resumed episode continues that turn from its last token (the engine's context is still the
trajectory); an aborted answer whose tokens already end the turn finishes it there instead.
"""

import copy
import logging
import random
from dataclasses import dataclass, replace

from slime.utils.types import Sample
from slime_search_r1.episode import Turn, episode_record, forget_episode, version_spans
from slime_search_r1.tokens.engine import engine_url, generate_turn, routing_headers, weight_version_of
from slime_search_r1.tokens.engine_rules import TurnEnds, model_eos_ids, settle
from slime_search_r1.training.staleness import lagging_spans

logger = logging.getLogger(__name__)


# ---- the driver -------------------------------------------------------------------------------------------------


class ManualDriver:
    """Each turn sends `input_ids` = the trajectory so far and appends what the engine sampled to the trajectory."""

    resumable = True  # a partial rollout's aborted episode can continue from the trajectory it wrote

    @classmethod
    async def prepare(cls, state) -> None:
        """Nothing to check: any SGLang engine or router serves /generate."""

    def __init__(self, state, trajectory, protocol):
        self.tokenizer = state.tokenizer
        self.trajectory = trajectory
        self.url = engine_url(state.args)
        self.use_slime_post = state.config.engine_transport == "slime" or bool(
            getattr(state.args, "use_distributed_post", False)
        )
        self.headers = routing_headers(state.args, state.sample)
        self.cut_at_stops = protocol.cut_at_stops  # an engine that ignores stop strings is cut after the first
        self.eos_ids = model_eos_ids(getattr(state.args, "hf_checkpoint", None), state.tokenizer)
        self.state = state
        self.keep_aborted = bool(getattr(state.args, "partial_rollout", False))  # slime resumes them

    @property
    def context_length(self) -> int:
        return self.trajectory.context_length

    @property
    def response_length(self) -> int:
        return self.trajectory.response_length

    def written_turn(self) -> Turn:
        """The turn under way as the trajectory holds it: what it sampled before an abort (or all of it)."""
        ids = self.trajectory.response_ids()[self.state.turn_start :]
        return Turn(ids, "stop", text=self.tokenizer.decode(ids, skip_special_tokens=False))

    async def generate(self, sampling_params: dict) -> Turn:
        """The turn under way: what the engine samples now, after what it sampled before an abort (if anything),
        settled into the turn it ends (engine_rules.settle)."""
        trajectory = self.trajectory
        written = self.written_turn().ids
        answer = await generate_turn(
            self.url,
            trajectory.context(),
            sampling_params,
            trajectory.track_log_probs,
            use_slime_post=self.use_slime_post,
            headers=self.headers,
        )
        ends = TurnEnds.of(sampling_params, self.cut_at_stops, self.eos_ids)
        answer = settle(answer, written, ends, sampling_params.get("max_new_tokens"), self.tokenizer)
        if answer.finish_type == "abort" and not (self.keep_aborted and answer.ids):
            return answer
        trajectory.add_generated(answer.ids, answer.log_probs, answer.meta_info, answer.versions)
        ids = written + answer.ids
        return replace(answer, ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=False))

    def add_observation(self, ids: list[int], short_ids: list[int] | None = None) -> None:
        self.trajectory.add_observation(ids, short_ids)

    async def finish(self, status) -> None:
        """Nothing to fetch: the trajectory was written turn by turn."""


# ---- the trajectory on the sample -------------------------------------------------------------------------------
# Model tokens always get loss mask 1 and the engine's log probs. Observation tokens get mask 0, or 1 when
# `train_observations` (LOSS_MASK_MODE=simple); their log probs are 0.0 placeholders because the engine never
# sampled them. With log probs tracked, slime's append_response_tokens does the bookkeeping; without,
# rollout_log_probs stays None and slime recomputes them. Either way each engine call's tokens are recorded with
# the weight version that sampled them (`versions`, positions in the whole episode's response); max_version_lag may
# take the oldest out of the loss at the end, before the episode is split.
#
# The sample always holds the episode as it happened: the prompt, then every turn and every observation in full.
# An observation may have a short form (a page chunk, tools/access.py); once a later turn has read it, the next
# context shows the short form instead (with split_trajectories), so that context is no longer a prefix of the
# sample. A new segment starts there: what the engine is sent from then on is the segment's prefix (the prompt and
# the response so far with the short forms in place) plus the response written since. At the end each segment
# becomes one sample for slime (segment_samples): its prefix and its part of the response, with that part's loss
# mask, log probs and engine calls, so every token is trained in exactly one sample, in the context it was sampled in.


@dataclass
class Segment:
    """One training sample's worth of an episode."""

    prefix: list[int]  # what the engine conditioned on before the segment's part of the response
    start: int  # the response position the segment's part begins at
    calls_before: int  # len(sample.weight_versions) when it began (slime adds one per engine call)


@dataclass
class ShortForm:
    """An observation that later contexts show shorter: its span in the response and the ids that replace it."""

    start: int
    end: int
    ids: list[int]
    read: bool = False  # a turn was generated after it
    replaced: bool = False  # the current segment's prefix holds `ids` in its place


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
        # [start, end, weight version] per engine call that sampled tokens, in response-token positions
        self.versions: list[list] = []
        if continued:
            self.versions = [list(span) for span in version_spans(episode_record(sample) or {})]
            sample.reward, sample.remove_sample, sample.status = None, False, Sample.Status.PENDING
        else:
            reset_response_fields(sample, prompt_ids, track_log_probs)
        self.segments = [Segment(self.prompt_ids, 0, len(sample.weight_versions))]
        self.short_forms: list[ShortForm] = []

    @property
    def response_length(self) -> int:
        """Response tokens of the whole episode, every segment's (what the response budget counts)."""
        return self.sample.response_length

    @property
    def context_length(self) -> int:
        """Tokens the engine conditions on next."""
        segment = self.segments[-1]
        return len(segment.prefix) + self.sample.response_length - segment.start

    def context(self) -> list[int]:
        """The ids the engine conditions on next: the sample's tokens, or the current segment's."""
        if len(self.segments) == 1:
            return list(self.sample.tokens)
        segment = self.segments[-1]
        return segment.prefix + self.sample.tokens[len(self.prompt_ids) + segment.start :]

    def response_ids(self) -> list[int]:
        return self.sample.tokens[len(self.prompt_ids) :]

    def add_generated(
        self, ids: list[int], log_probs: list[float] | None, meta_info: dict | None, versions=None
    ) -> None:
        """Sampled tokens; `versions`: (start, end, weight version) spans over them (one span of meta_info's
        weight_version when not given)."""
        start = self.response_length
        for form in self.short_forms:
            form.read = True
        if self.track_log_probs:
            self.sample.append_response_tokens(
                self.args, tokens=ids, log_probs=log_probs, trainable=True, meta_info=meta_info
            )
        else:
            self._extend_untracked(ids, 1)
            if meta_info and "weight_version" in meta_info:  # what slime's append_response_tokens keeps
                self.sample.weight_versions.append(meta_info["weight_version"])
        if versions is None:
            versions = [(0, len(ids), weight_version_of(meta_info))] if ids else []
        self.versions.extend([start + first, start + end, version] for first, end, version in versions)

    def mask_lagging_spans(self, max_lag: int, reference: int | None = None) -> int:
        """Loss mask 0 on the generated spans sampled more than `max_lag` weight versions before `reference` (the
        newest version the engines have shown; the episode's newest when that is newer or unknown), log probs
        unchanged; returns how many trained tokens that took out of the loss."""
        mask = self.sample.loss_mask
        masked = 0
        for start, end, _ in lagging_spans(self.versions, max_lag, reference):
            masked += sum(mask[start:end])
            mask[start:end] = [0] * (end - start)
        return masked

    def add_observation(self, ids: list[int], short_ids: list[int] | None = None) -> None:
        """The environment's reply; `short_ids`: what later contexts show instead, once a turn has read it."""
        start = self.sample.response_length
        if not self.track_log_probs:
            self._extend_untracked(ids, 1 if self.train_observations else 0)
        elif self.train_observations:
            self.sample.append_response_tokens(self.args, tokens=ids, log_probs=[0.0] * len(ids), trainable=True)
        else:
            self.sample.append_response_tokens(self.args, tokens=ids, trainable=False)
        if short_ids is not None and len(short_ids) < len(ids):
            self.short_forms.append(ShortForm(start, start + len(ids), list(short_ids)))

    def _extend_untracked(self, ids: list[int], mask: int) -> None:
        # append_response_tokens insists on log probs for trainable tokens, so do its bookkeeping here.
        self.sample.tokens += ids
        self.sample.response_length += len(ids)
        self.sample.loss_mask += [mask] * len(ids)

    def shorten_read_observations(self) -> int:
        """Before a turn: when the context shows in full an observation a turn has read since, start a new segment
        whose prefix shows its short form. Returns the tokens that saves (0: the context stays as it is)."""
        read = [form for form in self.short_forms if form.read and not form.replaced]
        if not read:
            return 0
        for form in read:
            form.replaced = True
        response = self.response_ids()
        prefix, position = list(self.prompt_ids), 0
        for form in self.short_forms:
            if form.replaced:
                prefix += response[position : form.start] + form.ids
                position = form.end
        prefix += response[position:]
        self.segments.append(Segment(prefix, len(response), len(self.sample.weight_versions)))
        return sum(form.end - form.start - len(form.ids) for form in read)

    def segment_samples(self, tokenizer) -> list[Sample]:
        """The episode as slime trains it: one sample per segment that holds response tokens, each its segment's
        prefix plus its part of the response (loss mask, log probs, top-p replay and engine calls sliced alike),
        sharing one rollout_id so slime's loss counts the episode once; status, reward, remove_sample and
        metadata are the episode's. The first is the sample slime handed over."""
        whole = self.sample
        ends = [segment.start for segment in self.segments[1:]] + [whole.response_length]
        calls_ends = [segment.calls_before for segment in self.segments[1:]] + [len(whole.weight_versions)]
        rollout_id = shared_rollout_id(whole)
        response = self.response_ids()
        parts = []
        for segment, end, calls_end in zip(self.segments, ends, calls_ends, strict=True):
            if end == segment.start:
                continue  # nothing was written after it began (the episode ended first)
            ids = response[segment.start : end]
            log_probs = whole.rollout_log_probs
            fields = dict(
                rollout_id=rollout_id,
                tokens=segment.prefix + ids,
                response=tokenizer.decode(ids, skip_special_tokens=False),
                response_length=len(ids),
                loss_mask=whole.loss_mask[segment.start : end],
                rollout_log_probs=None if log_probs is None else log_probs[segment.start : end],
                weight_versions=list(whole.weight_versions[segment.calls_before : calls_end]),
                metadata=copy.deepcopy(whole.metadata),
            )
            fields.update(_top_p_part(whole, segment.start, end))
            parts.append(fields)
        samples = []
        for index, fields in enumerate(parts):
            if index == 0:
                for name, value in fields.items():
                    setattr(whole, name, value)
                samples.append(whole)
            else:  # the counters of the engine calls stay on the first, as one episode's
                fields.update(prefix_cache_info=type(whole.prefix_cache_info)(), spec_info=type(whole.spec_info)())
                samples.append(replace(whole, **fields))
        return samples

    def replace_response(self, ids: list[int], loss_mask: list[int], log_probs: list[float] | None) -> None:
        """The whole response at once, as a router's cache recorded it (the router token-tracking modes)."""
        reset_response_fields(self.sample, self.prompt_ids + list(ids), self.track_log_probs)
        self.versions = []  # a router's cache keeps no weight versions
        self.sample.response_length = len(ids)
        self.sample.loss_mask = [1] * len(ids) if self.train_observations else [int(m) for m in loss_mask]
        if self.track_log_probs:
            self.sample.rollout_log_probs = [float(v) for v in log_probs]

    def decode_response(self, tokenizer) -> None:
        self.sample.response = tokenizer.decode(self.sample.tokens[len(self.prompt_ids) :], skip_special_tokens=False)


def shared_rollout_id(sample: Sample) -> int:
    """The rollout_id the segments of one episode share: the sample's own, else its index (unique in slime's data
    buffer), else a random one (slime numbers samples without one from 0 up, skipping ids already taken)."""
    if sample.rollout_id is not None:
        return sample.rollout_id
    if sample.index is not None:
        return sample.index
    return random.getrandbits(62)


def _top_p_part(sample: Sample, start: int, end: int) -> dict:
    """The top-p replay arrays of response positions [start, end) (token i's nucleus is ids[offsets[i]:offsets[i+1]]),
    in the type slime keeps them in; nothing when there are none."""
    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    if ids is None or offsets is None:
        return {}
    offsets_part = offsets[start : end + 1]
    first, last = int(offsets_part[0]), int(offsets_part[-1])
    if hasattr(offsets_part, "clone"):  # torch int32 tensors
        return {
            "rollout_top_p_token_ids": ids[first:last].clone(),
            "rollout_top_p_token_offsets": offsets_part - first,
        }
    return {
        "rollout_top_p_token_ids": list(ids[first:last]),
        "rollout_top_p_token_offsets": [int(o) - first for o in offsets_part],
    }


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
    spans = version_spans(episode_record(sample) or {})
    if spans and spans[-1][1] > response_length:
        return f"weight-version spans up to token {spans[-1][1]} for {response_length} response tokens"
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
