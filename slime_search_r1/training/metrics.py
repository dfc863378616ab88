"""Per-rollout search metrics for slime's wandb / TensorBoard logs, read from sample.metadata["search_r1"].

    --custom-rollout-log-function-path generate_with_search.log_rollout_metrics
    --custom-eval-rollout-log-function-path generate_with_search.log_eval_rollout_metrics

Both hooks log through slime's own tracking call (slime.observability.logging_utils.log) at slime's rollout
step, so the metrics go wherever --use-wandb / --use-tensorboard send slime's, and both return False so slime's
default logging still runs. Names sit under rollout/search_r1/ and eval/search_r1/<dataset>/: slime's wandb setup
plots rollout/* against rollout/step and eval/* against eval/step. search_metrics reads the samples' counters, and
the loss mask over each engine call's span only when the batch's tokens come from several weight versions
(fully-async training: how many trained tokens an older policy sampled); the early warnings of a collapse
(health_metrics, training/collapse.py) make one pass over each response's generated tokens, log probs and text.
"""

import logging
from collections import Counter, defaultdict
from statistics import fmean
from types import SimpleNamespace

import numpy as np

from slime_search_r1.episode import (
    FinishReason,
    episode_record,
    first_part_of_episode,
    reward_of,
    segment_of,
    tool_counters,
    unscored,
)
from slime_search_r1.registry import reward_names
from slime_search_r1.training.collapse import CollapseWatch, health_signals
from slime_search_r1.training.staleness import staleness_metrics

logger = logging.getLogger(__name__)

TRAIN_PREFIX = "rollout/search_r1/"
EVAL_PREFIX = "eval/search_r1/"
# How an episode ended -> the share it counts in; both abort paths are one share.
FINISH_SHARES = {reason: reason.value for reason in FinishReason} | {
    FinishReason.ROLLOUT_ABORTED: "aborted",
    FinishReason.ENGINE_ABORT: "aborted",
}
# Where evaluation reads a sample's data source: slime copies the data file's --metadata-key column
# (default "metadata") into sample.metadata, so rows carry {"data_source": "nq"} there.
DATA_SOURCE_KEY = "data_source"
# The early warnings compare each rollout with the ones before it (in this process: slime's rollout manager).
COLLAPSE_WATCH = CollapseWatch()


def _status(sample) -> str:
    return getattr(sample.status, "value", str(sample.status))


def _tool_metrics(records: list[dict]) -> dict[str, float]:
    """Per tool: finished calls per sample, calls that failed for good, and each call's latency (retries included)."""
    metrics: dict[str, float] = {}
    names = sorted({name for record in records for name in tool_counters(record)})
    for name in names:
        counters = [tool_counters(record).get(name, {}) for record in records]
        metrics[f"tools/{name}/calls/mean"] = fmean(c.get("calls", 0) for c in counters)
        metrics[f"tools/{name}/failures"] = sum(c.get("failures", 0) for c in counters)
        latencies = [seconds for c in counters for seconds in c.get("seconds", ())]
        if latencies:
            p50, p99 = np.percentile(latencies, [50, 99])
            metrics[f"tools/{name}/latency/p50"] = float(p50)
            metrics[f"tools/{name}/latency/p99"] = float(p99)
    return metrics


def abort_metrics(records: list[dict]) -> dict[str, float]:
    """Aborts as the engine answered them (finish_reason abort): in fully-async training a weight update pauses the
    engines and aborts what is in flight, while slime's abort flag never turns true."""
    aborts = [record.get("engine_aborts", 0) for record in records]
    count = len(records)
    return {
        "engine_aborts/mean": fmean(aborts),
        # of those, the answers whose tokens had already ended their turn (it finished there, nothing was lost)
        "aborts_after_turn_end/mean": fmean(record.get("aborts_after_turn_end", 0) for record in records),
        "engine_aborted_share": sum(a > 0 for a in aborts) / count,
        "restarted_share": sum(record.get("restarts", 0) > 0 for record in records) / count,
    }


def _episode_response_length(sample, record: dict) -> int:
    """The episode's response tokens; a split one's first sample holds only its own part of them."""
    if segment_of(record) is None:
        return sample.response_length
    return record.get("generated_tokens", 0) + record.get("observation_tokens", 0)


def _long_horizon_metrics(records: list[dict]) -> dict[str, float]:
    """Forced answers and page chunks (only what happened: nothing when the features are off)."""
    metrics: dict[str, float] = {}
    count = len(records)
    forced = [record for record in records if record.get("forced_answer")]
    if forced:
        metrics["forced_answer_share"] = len(forced) / count
        # of the episodes told (or given a last turn) to answer, those that did
        metrics["forced_answer/answered_share"] = fmean(r["finish_reason"] == FinishReason.ANSWER for r in forced)
        metrics["forced_answer/instruction_tokens/mean"] = fmean(r["forced_answer"].get("tokens", 0) for r in forced)
    chunks = [record.get("page_chunks", 0) for record in records]
    if any(chunks):
        metrics["page_chunks/mean"] = fmean(chunks)
        metrics["page_chunks/max"] = max(chunks)
        metrics["short_form_tokens_saved/mean"] = fmean(record.get("short_form_tokens_saved", 0) for record in records)
    return metrics


def training_metrics(all_samples: list[tuple], records: list[dict]) -> dict[str, float]:
    """The figures only a training rollout can give (only what happened, as the others): engine aborts over every
    attempt and restarts (slime hands an aborted sample back: partial rollout, the fully-async worker), the weight
    versions' lag (weights change during training's rollouts), resumed episodes (--partial-rollout) and split ones
    (split_trajectories). An evaluation (slime's eval rollouts, evaluate.py) samples with one policy, ends an aborted
    episode where it stands (finish/aborted counts it) and never splits one (loop.py), so there they are zero or
    absent. `all_samples`: (sample, record) of every sample; `records`: one per episode."""
    count = len(records)
    metrics = abort_metrics(records) | staleness_metrics(all_samples)
    resumed = [record for record in records if record.get("resumes")]
    if resumed:  # --partial-rollout: episodes an abort interrupted, finished here
        metrics["resumed_samples"] = len(resumed)
        generated = sum(record.get("generated_tokens", 0) for record in resumed)
        earlier = sum(record.get("earlier_policy_tokens", 0) for record in resumed)
        metrics["resumed_earlier_policy_share"] = earlier / generated if generated else 0.0
    segments = [record.get("segments", 1) for record in records]
    if max(segments) > 1:
        metrics["split_share"] = sum(n > 1 for n in segments) / count
        metrics["segments/mean"] = fmean(segments)
        metrics["segments/max"] = max(segments)
    return metrics


def search_metrics(samples, *, training: bool = True) -> dict[str, float]:
    """Search behaviour of a batch of finished samples, one count per episode; {} when none was generated by this
    plugin. training=False leaves out training_metrics' figures (what an evaluation cannot have)."""
    all_samples = [(sample, record) for sample in samples if (record := episode_record(sample)) is not None]
    episodes = [(sample, record) for sample, record in all_samples if first_part_of_episode(record)]
    if not episodes:
        return {}
    records = [record for _, record in episodes]
    searches = [tool_counters(record).get("search", {}) for record in records]
    finishes = Counter(FINISH_SHARES.get(FinishReason(r["finish_reason"]), "other") for r in records)
    lengths_by_status: dict[str, list[int]] = defaultdict(list)
    for sample, record in episodes:
        lengths_by_status[_status(sample)].append(_episode_response_length(sample, record))
    turns = [record.get("turns", 0) for record in records]
    invalid = [record.get("invalid_actions", 0) for record in records]
    observation_tokens = [record.get("observation_tokens", 0) for record in records]

    count = len(episodes)
    metrics: dict[str, float] = {
        "samples": count,
        "turns/mean": fmean(turns),
        "turns/max": max(turns),
        # search calls that returned results (the paper's valid searches)
        "searches/mean": fmean(s.get("calls", 0) for s in searches),
        "searches/max": max(s.get("calls", 0) for s in searches),
        "searched_share": sum(s.get("calls", 0) + s.get("failures", 0) > 0 for s in searches) / count,
        "invalid_actions/mean": fmean(invalid),
        "invalid_action_share": sum(i > 0 for i in invalid) / count,
        "failed_share": len(lengths_by_status.get("failed", ())) / count,
        "observation_tokens/mean": fmean(observation_tokens),
        "observation_tokens/max": max(observation_tokens),
        **_tool_metrics(records),
        **(training_metrics(all_samples, records) if training else {}),
        **_long_horizon_metrics(records),
    }
    for share in sorted(set(FINISH_SHARES.values())):
        metrics[f"finish/{share}"] = finishes[share] / count
    if finishes["other"]:
        metrics["finish/other"] = finishes["other"] / count
    scored = [reward for record in records if (reward := reward_of(record)) is not None]  # slime skips aborted
    if scored:
        metrics["em"] = fmean(float(r.get("em", 0.0)) for r in scored)
        metrics["format_valid"] = fmean(float(r.get("format_valid", 0.0)) for r in scored)
        metrics["retrieval_hit"] = fmean(float(r.get("retrieval_hit", 0.0)) for r in scored)
        metrics |= reward_metrics(scored)
    for status, lengths in sorted(lengths_by_status.items()):
        metrics[f"response_length/{status}"] = fmean(lengths)
    return metrics


def reward_metrics(rewards: list[dict]) -> dict[str, float]:
    """The shaped reward and the answer score it was built on, over the samples the judge did not leave unscored
    (their score is a placeholder: they are not trained on); with the judge, how many it left unscored and why."""
    judged = [r for r in rewards if "judge_verdict" in r]
    trained = [r for r in rewards if not unscored(r)]
    metrics: dict[str, float] = {}
    if trained:
        metrics["reward"] = fmean(float(r.get("score", 0.0)) for r in trained)  # the shaped reward trained on
        # Well-formed but wrong: the format bonus without the answer (what a policy farming the bonus raises).
        metrics["well_formed_wrong_share"] = fmean(bool(r.get("format_valid")) and not r.get("em") for r in trained)
        for name in (name for name in reward_names() if name != "em"):  # em is above; a reward holds its own
            values = [float(r[name]) for r in trained if isinstance(r.get(name), int | float)]
            if values:
                metrics[name] = fmean(values)
    if judged:
        statuses = Counter(r["judge_verdict"].get("status") for r in judged)
        left = statuses["error"] + statuses["invalid"]
        metrics |= {"judge/unscored": left, "judge/unscored_share": left / len(judged)}
        metrics |= {"judge/error": statuses["error"], "judge/invalid": statuses["invalid"]}
    return metrics


def health_metrics(samples) -> dict[str, float]:
    """The early warnings' signals of a batch (training/collapse.py): the one pass over each response's generated
    tokens, log probs and text; {} when no sample was generated by this plugin."""
    return health_signals(whole_episodes(samples))


def whole_episodes(samples) -> list[tuple[object, dict]]:
    """(sample, record) per episode, the parts of a split episode (split_trajectories) joined back in order: a signal
    about what the model wrote (an answer at the end, a loop across parts) reads the whole episode once."""
    episodes: list[tuple[object, dict]] = []
    parts: list = []
    for sample in samples:
        record = episode_record(sample)
        if record is None:
            continue
        segment = segment_of(record)
        if segment is None:
            episodes.append((sample, record))
            continue
        parts = [sample] if segment.get("index") == 0 else [*parts, sample]
        if len(parts) == segment.get("count"):
            episodes.append((_joined(parts), record))
    return episodes


def _joined(parts: list):
    """The parts' responses as one, with what the signals read of a sample (collapse.generated, texts, status)."""
    first = parts[0]
    log_probs = [part.rollout_log_probs for part in parts]
    return SimpleNamespace(
        prompt=first.prompt,
        response="".join(part.response for part in parts),
        response_ids=[t for part in parts for t in part.tokens[len(part.tokens) - part.response_length :]],
        response_length=sum(part.response_length for part in parts),
        loss_mask=[m for part in parts for m in (part.loss_mask or [1] * part.response_length)],
        rollout_log_probs=None if None in log_probs else [v for values in log_probs for v in values],
        status=first.status,
        group_index=first.group_index,
        remove_sample=first.remove_sample,
    )


def em_by_data_source(samples) -> dict[str, float]:
    """EM per metadata["data_source"] and their mean (Search-R1's "Avg"); {} when no sample names a source."""
    by_source: dict[str, list[float]] = defaultdict(list)
    named = False
    for sample in samples:
        record = episode_record(sample)
        reward = reward_of(record) if record is not None else None
        if reward is None:
            continue
        source = sample.metadata.get(DATA_SOURCE_KEY)
        named = named or source is not None
        by_source[str(source) if source is not None else "unknown"].append(float(reward.get("em", 0.0)))
    if not named:
        return {}
    ems = {source: fmean(values) for source, values in sorted(by_source.items())}
    return {**{f"em_by_source/{source}": em for source, em in ems.items()}, "em_source_average": fmean(ems.values())}


def eval_search_metrics(data: dict) -> dict[str, float]:
    """slime's evaluation data {dataset: {"rewards", "truncated", "samples"}} -> eval/search_r1/<dataset>/..."""
    metrics: dict[str, float] = {}
    for dataset, result in data.items():
        samples = result.get("samples") or []
        prefix = f"{EVAL_PREFIX}{dataset}/"
        found = search_metrics(samples) | em_by_data_source(samples) | health_metrics(samples)
        metrics |= {prefix + name: value for name, value in found.items()}
    return metrics


def _log(args, rollout_id: int, metrics: dict, step_key: str) -> None:
    # Imported here: slime's logging_utils imports wandb, which nothing else in the plugin needs.
    from slime.observability import logging_utils
    from slime.observability.metric_utils import compute_rollout_step

    logger.info("search_r1 %s %s: %s", step_key.split("/")[0], rollout_id, metrics)
    metrics[step_key] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, metrics, step_key=step_key)


def watch_for_collapse(rollout_id, found: dict[str, float], watch: CollapseWatch | None = None) -> dict:
    """The early warnings' changes against the previous rollouts (COLLAPSE_WATCH's unless `watch` is given), and a
    warning line for each signal out of its band (training/collapse.py); judge verdicts that left samples unscored are
    one line too."""
    changes, alarms = (watch or COLLAPSE_WATCH).observe(found)
    for alarm in alarms:
        logger.warning("search_r1 collapse warning at rollout %s: %s", rollout_id, alarm.message)
    if found.get("judge/unscored"):
        logger.warning(
            "search_r1 rollout %s: the judge left %d samples unscored (%d errors, %d replies without a verdict); they "
            "are kept out of training, and each one's verdict is in its record",
            rollout_id,
            found["judge/unscored"],
            found.get("judge/error", 0),
            found.get("judge/invalid", 0),
        )
    return {**changes, "health/alarms": len(alarms)}


def log_rollout_metrics(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool:
    """slime's custom rollout log function: logs rollout/search_r1/* and lets slime's own logging run."""
    found = search_metrics(samples)
    if found:
        found |= health_metrics(samples)
        found |= watch_for_collapse(rollout_id, found)
    metrics = {TRAIN_PREFIX + name: value for name, value in found.items()}
    if metrics:
        _log(args, rollout_id, metrics, "rollout/step")
    return False


def log_eval_rollout_metrics(rollout_id, args, data, extra_metrics) -> bool:
    """slime's custom eval log function: logs eval/search_r1/<dataset>/* and lets slime's own logging run."""
    metrics = eval_search_metrics(data)
    if metrics:
        _log(args, rollout_id, metrics, "eval/step")
    return False
