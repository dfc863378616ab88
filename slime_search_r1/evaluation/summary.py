"""A run's summary: every score per data source and their mean over the data sources (Search-R1's "Avg").

Scores (registry.reward_names(), in report order): em (the plugin's reward_func, pure exact match), f1, cover_em
and any answer score an extension registers (scoring/answers.py's rule_scores), judge (an LLM judge's verdicts,
scoring/judge.py). With k samples per question each is avg@k (the mean of a question's scored samples) and
gets a pass@k beside it: the expected best score of k samples drawn from a question's n >= k scored ones (pass_at_k;
for 0/1 scores Chen et al.'s unbiased estimator, 1 - C(n-c, k) / C(n, k) with c right). A question with fewer than k
scored samples (unjudged, or the run incomplete) has no pass@k: it is left out of it and counted (`{key}_short`).
Both are means over the questions of a data source, and the average is the mean over data sources.

The reports (reports.py, chart.py, comparison.py) show these figures with score_label and format_score.
"""

import math
from pathlib import Path
from statistics import fmean

from slime_search_r1.data import SEARCH_R1_DATA_SOURCES
from slime_search_r1.registry import ANSWER_SCORES
from slime_search_r1.standin import SCRIPTED_LABEL

_NAMES = {"em": "EM", "f1": "F1", "cover_em": "cover EM", "judge": "judge"}  # how tables name them; others as named


def summarize(
    records: list[dict], selected_per_source: dict[str, int], samples_per_question: int = 1, judge: dict | None = None
) -> dict:
    """Every score per data source and their mean (Search-R1's "Avg" column), over the records of this selection.

    `selected_per_source` counts the trajectories expected (questions x samples); `judge` (the judge's description)
    says the records carry judge verdicts ("judge": score or None, "judge_status")."""
    k = samples_per_question
    base = present_scores(records, judge is not None)
    keys = base + ([pass_key(score, k) for score in base] if k > 1 else [])
    by_source: dict[str, list[dict]] = {source: [] for source in selected_per_source}
    for record in records:
        by_source.setdefault(record["data_source"], []).append(record)
    sources = {}
    everything: dict[str, list[float]] = {key: [] for key in keys}
    for source in source_order(by_source):
        done = by_source[source]
        questions = _questions(done)
        stats = {"n": len(done), "selected": selected_per_source.get(source, len(done)), "questions": len(questions)}
        for score in base:
            averages, best, short = _question_scores(questions, score, k)
            stats[score] = _mean_or_none(averages)
            everything[score] += averages
            if k > 1:
                stats[pass_key(score, k)] = _mean_or_none(best)
                stats[f"{pass_key(score, k)}_short"] = short
                everything[pass_key(score, k)] += best
        if judge is not None:
            stats["unjudged"] = sum(r.get("judge") is None for r in done)
        stats |= {
            "mean_searches": _mean_or_none([float(r.get("searches", 0)) for r in done]),
            "mean_turns": _mean_or_none([float(r.get("turns", 0)) for r in done]),
            "statuses": {s: sum(r["status"] == s for r in done) for s in sorted({r["status"] for r in done})},
        }
        sources[source] = stats
    summary = {"scores": keys, "samples_per_question": k, "data_sources": sources}
    for key in keys:
        # mean over data sources, as in Search-R1's tables; and over all questions
        summary[f"average_{key}"] = _mean_or_none([s[key] for s in sources.values() if s[key] is not None])
        summary[f"micro_{key}"] = _mean_or_none(everything[key])
        if "_pass@" in key:
            summary[f"{key}_short"] = sum(s[f"{key}_short"] for s in sources.values())
    summary |= {
        "scripted": any(record.get("scripted") for record in records),  # the scripted stand-in answered
        "n": len(records),
        "selected": sum(selected_per_source.values()),
        "complete": len(records) == sum(selected_per_source.values()),
    }
    if judge is not None:
        summary["judge"] = judge
        summary["unjudged"] = sum(s["unjudged"] for s in sources.values())
    return summary


def model_name(hf_checkpoint, scripted: bool) -> str:
    """How the reports name what answered: the checkpoint's folder; for the scripted stand-in, that it was one and
    whose tokenizer it wrote with."""
    name = Path(str(hf_checkpoint or "")).name or str(hf_checkpoint or "model")
    return f"{SCRIPTED_LABEL} (tokenizer {name})" if scripted else name


def pass_key(score: str, k: int) -> str:
    return f"{score}_pass@{k}"


def score_label(key: str, samples_per_question: int = 1) -> str:
    """EM, F1, cover EM, judge; "EM avg@4" with 4 samples per question; "EM pass@4" for em_pass@4."""
    base, _, k = key.partition("_pass@")
    name = _NAMES.get(base, base)
    if k:
        return f"{name} pass@{k}"
    return f"{name} avg@{samples_per_question}" if samples_per_question > 1 else name


def format_score(value: float | None, digits: int = 3) -> str:
    """A figure as the reports print it: `digits` decimals, "-" when there is none."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _mean_or_none(values: list[float]) -> float | None:
    return fmean(values) if values else None


def source_order(sources) -> list[str]:
    known = [source for source in SEARCH_R1_DATA_SOURCES if source in sources]
    return known + sorted(set(sources) - set(known))


def pass_at_k(values: list[float], k: int) -> float | None:
    """The expected best of k samples drawn without replacement from a question's n scored samples `values`: the
    i-th smallest of n is the best of k with probability C(i-1, k-1) / C(n, k). For 0/1 scores with c right this is
    Chen et al.'s (2021) unbiased pass@k, 1 - C(n-c, k) / C(n, k); at n = k it is the best of the n. None when n < k:
    fewer samples than k say nothing about the best of k."""
    n = len(values)
    if n < k:
        return None
    draws = math.comb(n, k)
    return sum(value * math.comb(i, k - 1) for i, value in enumerate(sorted(values))) / draws


def _questions(records: list[dict]) -> list[list[dict]]:
    """The records grouped by question (their row in the data file), in first-seen order."""
    groups: dict[object, list[dict]] = {}
    for position, record in enumerate(records):
        groups.setdefault(record.get("index", ("line", position)), []).append(record)
    return list(groups.values())


def _question_scores(questions: list[list[dict]], score: str, k: int) -> tuple[list[float], list[float], int]:
    """avg@k of each question that has this score on at least one sample, pass@k of each that has it on k or more,
    and how many questions have it on fewer than k (left out of pass@k)."""
    averages, best, short = [], [], 0
    for samples in questions:
        values = [float(r[score]) for r in samples if r.get(score) is not None]
        if values:
            averages.append(fmean(values))
        passed = pass_at_k(values, k)
        if passed is None:
            short += 1
        else:
            best.append(passed)
    return averages, best, short


def present_scores(records: list[dict], judged: bool) -> list[str]:
    found = [name for name in ANSWER_SCORES.names() if name != "em" and any(r.get(name) is not None for r in records)]
    return ["em", *found, *(["judge"] if judged else [])]
