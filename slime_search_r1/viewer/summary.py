"""A run's figures: the log hooks' own metrics, computed by the hooks' own functions (training/metrics.py), so a page
and a wandb curve of the same rollout show the same numbers under the same names; then a few figures only the viewer
shows (reward spread, statuses, GRPO groups without signal, train/rollout log-prob gaps). An evaluation's page leaves
out what only training gives: training_metrics' figures and the GRPO groups' (an evaluation trains nothing)."""

from collections import Counter, defaultdict
from statistics import fmean, pstdev

from slime_search_r1.episode import reward_of
from slime_search_r1.training.collapse import CollapseWatch
from slime_search_r1.training.metrics import (
    EVAL_PREFIX,
    TRAIN_PREFIX,
    em_by_data_source,
    health_metrics,
    search_metrics,
)
from slime_search_r1.viewer.samples import Run, ViewSample

TRAIN_LOG_PROBS = "log_probs"  # the train dump's name for the policy's recomputed log probs


def hook_prefix(run: Run) -> str:
    """Where the hooks log these figures: rollout/search_r1/<name>, or eval/search_r1/<dataset>/<name>."""
    return TRAIN_PREFIX if is_training(run) else EVAL_PREFIX + "<dataset>/"


def is_training(run: Run) -> bool:
    """A training rollout; the other runs are evaluations (slime's eval_<id> dumps, evaluate.py folders)."""
    return run.kind == "rollout"


def hook_metrics(run: Run) -> dict[str, float]:
    """The hooks' figures of the run; an evaluation's without the ones only training gives (training_metrics)."""
    metrics = search_metrics(run.samples, training=is_training(run))
    if not is_training(run):
        metrics |= em_by_data_source(run.samples)
    return metrics | health_metrics(run.samples)


def collapse_warnings(runs: list[Run], hooks: list[dict[str, float]]) -> list[list[str]]:
    """The training rollouts' early warnings, as the log hook gives them: each rollout on the page against the ones
    before it (by rollout id); their changes are added to `hooks`. One list of warnings per run."""
    warnings: list[list[str]] = [[] for _ in runs]
    watch = CollapseWatch()
    training = [(r.rollout_id, i) for i, r in enumerate(runs) if is_training(r) and r.rollout_id is not None]
    for _, index in sorted(training):
        changes, alarms = watch.observe(hooks[index])
        hooks[index] |= {**changes, "health/alarms": len(alarms)}
        warnings[index] = [alarm.message for alarm in alarms]
    return warnings


def log_prob_gaps(sample: ViewSample) -> list[float]:
    """|train log prob - rollout log prob| of each trained token (the mismatch TIS corrects); [] without both."""
    train, rollout, mask = sample.series.get(TRAIN_LOG_PROBS), sample.rollout_log_probs, sample.loss_mask
    if train is None or rollout is None or mask is None or not len(train) == len(rollout) == len(mask):
        return []
    return [abs(t - r) for t, r, m in zip(train, rollout, mask, strict=True) if m]


def viewer_metrics(run: Run, threshold: float) -> dict[str, float]:
    samples = run.samples
    metrics: dict[str, float] = {f"status/{s}": n for s, n in sorted(Counter(s.status for s in samples).items())}
    scores = [float(r.get("score") or 0.0) for s in samples if (r := _reward(s)) is not None]
    if scores:
        metrics["reward/std"] = pstdev(scores)
        metrics["reward/min"] = min(scores)
        metrics["reward/max"] = max(scores)
    if is_training(run):
        metrics |= group_metrics(samples)
    if samples:
        lengths = [s.response_length for s in samples]
        metrics["response_length/mean"] = fmean(lengths)
        metrics["response_length/max"] = max(lengths)
    gaps = [gap for sample in samples for gap in log_prob_gaps(sample)]
    if gaps:
        metrics["train_rollout_log_prob_gap/mean"] = fmean(gaps)
        metrics["train_rollout_log_prob_gap/max"] = max(gaps)
        metrics["train_rollout_log_prob_gap/over_threshold_share"] = fmean(gap > threshold for gap in gaps)
    return metrics


def group_metrics(samples: list[ViewSample]) -> dict[str, float]:
    """A GRPO group whose rewards are all equal has zero advantage: it teaches nothing."""
    groups: dict[int, list[float]] = defaultdict(list)
    for sample in samples:
        reward = _reward(sample)
        if sample.group_index is not None and reward is not None:
            groups[sample.group_index].append(float(reward.get("score") or 0.0))
    sized = [values for values in groups.values() if len(values) > 1]
    return {"groups/zero_spread_share": fmean(max(v) == min(v) for v in sized)} if sized else {}


def _reward(sample: ViewSample) -> dict | None:
    record = sample.record
    return reward_of(record) if record is not None else None
