"""How far behind the policy being trained a batch's tokens are, and the lag mask applied when slime forms the batch.

The reference is the newest weight version any engine answer has shown in this process (episode.ENGINE_VERSIONS),
or the batch's own newest when that is newer. slime pushes every update to every engine before it trains on, so the
reference is the policy that trains the batch, or the one before it where train_async.py forms the batch ahead of
the update that precedes its training step. A batch whose groups waited in the fully-async worker's queue across an
update lags by that update although all its tokens share one version.

  lagging_spans        the spans more than N versions behind the newest policy: what the lag mask covers, at an
                       episode's end (tokens/manual.py) and when slime forms the batch (below)
  staleness_metrics    rollout/search_r1/versions/*: each episode's lag (the reference minus its oldest version),
                       mixed versions, the trained tokens an older policy sampled, what the lag mask covers
  mask_lagging_tokens  SEARCH_R1_MAX_VERSION_LAG=N, run by post_process_rewards when slime forms the batch: loss mask
                       0 on the generated spans more than N versions behind the reference (generate() masked each
                       episode when it ended against the reference then; the batch's can only be newer)

An episode's record says which mask applies to it ("max_version_lag", written when the setting is on).
"""

from statistics import fmean

from slime_search_r1.episode import (
    ENGINE_VERSIONS,
    episode_record,
    first_part_of_episode,
    part_spans,
    version_number,
    version_spans,
)

MAX_VERSION_LAG_KEY = "max_version_lag"


def newest_version(spans) -> int | None:
    """The newest ordered version among (start, end, version) spans, or None when none is ordered."""
    numbers = [number for _, _, version in spans if (number := version_number(version)) is not None]
    return max(numbers) if numbers else None


def lagging_spans(spans, max_lag: int, reference: int | None = None) -> list[tuple[int, int, str | None]]:
    """The spans sampled more than `max_lag` versions before the newest policy: `reference` (the newest version the
    engines have shown: ENGINE_VERSIONS) or the newest of `spans`, whichever is newer; spans of an unordered version
    never lag."""
    known = [number for number in (newest_version(spans), reference) if number is not None]
    if not known:
        return []
    newest = max(known)
    return [
        (start, end, version)
        for start, end, version in spans
        if (number := version_number(version)) is not None and newest - number > max_lag
    ]


def reference_version(spans) -> int | None:
    """The version a batch's lag is measured against: the newest the engines have shown, or the newest of `spans`
    (the batch's) when that is newer; None when neither is an ordered version."""
    known = [number for number in (newest_version(spans), ENGINE_VERSIONS.newest) if number is not None]
    return max(known) if known else None


def _lag_masked_spans(record: dict, response_length: int, reference: int | None) -> list[tuple[int, int, str | None]]:
    """The spans of this sample (its own part of a split episode) the lag mask covers; none when it is off."""
    max_lag = record.get(MAX_VERSION_LAG_KEY)
    if max_lag is None:
        return []
    return lagging_spans(part_spans(record, response_length), max_lag, reference)


def mask_lagging_tokens(samples) -> int:
    """The lag mask at batch time, on every sample whose record carries max_version_lag (log probs unchanged);
    returns the trained tokens it took out of the loss. Each episode's record counts them under lag_masked_tokens
    (on every part of a split episode, as each part carries the whole episode's record)."""
    records = [(sample, record) for sample in samples if (record := episode_record(sample)) is not None]
    reference = reference_version([span for _, record in records for span in version_spans(record)])
    masked_by_episode: dict[object, int] = {}
    for sample, record in records:
        mask = sample.loss_mask
        if sample.remove_sample or mask is None:  # out of the loss whatever its mask says
            continue
        masked = 0
        for start, end, _ in _lag_masked_spans(record, sample.response_length, reference):
            masked += sum(mask[start:end])
            mask[start:end] = [0] * (end - start)
        key = sample.rollout_id if record.get("segment") else id(sample)
        masked_by_episode[key] = masked_by_episode.get(key, 0) + masked
    for sample, record in records:
        key = sample.rollout_id if record.get("segment") else id(sample)
        if record.get(MAX_VERSION_LAG_KEY) is not None:
            record["lag_masked_tokens"] = record.get("lag_masked_tokens", 0) + masked_by_episode.get(key, 0)
    return sum(masked_by_episode.values())


def staleness_metrics(samples: list[tuple]) -> dict[str, float]:
    """How far behind the reference (module docstring) the batch's generated tokens are ({} when no sample recorded
    an ordered weight version). `samples`: (sample, record) of every sample, each part of a split episode included
    (its record holds the whole episode's spans; its loss mask only its own part). The loss mask is read as slime
    will train it: with the lag mask that post_process_rewards applies next."""
    spans_of = [(sample, record, version_spans(record)) for sample, record in samples]
    reference = reference_version([span for _, _, spans in spans_of for span in spans])
    if reference is None:
        return {}
    lags, mixed, generated, covered = [], 0, 0, 0
    for _, record, spans in spans_of:
        if not first_part_of_episode(record):
            continue
        ordered = [number for _, _, version in spans if (number := version_number(version)) is not None]
        if ordered:
            lags.append(reference - min(ordered))
            mixed += len({version for _, _, version in spans}) > 1
            generated += record.get("generated_tokens", 0)
            if record.get(MAX_VERSION_LAG_KEY) is not None:
                lagging = lagging_spans(spans, record[MAX_VERSION_LAG_KEY], reference)
                covered += sum(end - start for start, end, _ in lagging)
    if not lags:  # only later parts of split episodes (their first part carries the episode's figures)
        return {}
    trained = stale_trained = 0
    if max(lags):  # some tokens are older than the reference: count the trained ones
        for sample, record, _ in spans_of:
            if sample.remove_sample:  # out of the loss whatever its mask says
                continue
            mask = list(sample.loss_mask or [])
            for start, end, _ in _lag_masked_spans(record, sample.response_length, reference):
                mask[start:end] = [0] * (end - start)
            for start, end, version in part_spans(record, sample.response_length):  # a split one's part: its own
                kept = sum(mask[start:end])
                trained += kept
                number = version_number(version)
                stale_trained += kept if number is not None and number < reference else 0
    return {
        "versions/newest": reference,
        "versions/lag/mean": fmean(lags),
        "versions/lag/max": max(lags),
        "versions/mixed_share": mixed / len(lags),
        "versions/stale_trained_token_share": stale_trained / trained if trained else 0.0,
        "versions/lag_masked_share": covered / generated if generated else 0.0,
    }
