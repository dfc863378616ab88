"""The page: one HTML file with its script, style and data inside, so it opens from disk and travels as one file.

The data goes in two layers. The run list (summaries, one light row per sample, the token vocabulary) is parsed at
once; each sample's detail (token ids, loss mask, log probs and the train side as base64 typed arrays, its turns,
tool calls and record) sits in its own <script type="application/json"> block that the page parses only when the
sample is opened, so a 256-sample rollout opens as fast as a small one.

Nothing from a sample is ever markup: the data is JSON with <, > and & written as \\u escapes (a passage holding
</script> cannot end its block), and the page's script puts every string into the document as text.
"""

import base64
import hashlib
import html
import json
import math
import re
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

import numpy as np

from slime_search_r1.data import golden_answers
from slime_search_r1.episode import (
    conversation_of,
    part_spans,
    reward_of,
    tool_counters,
    version_number,
    version_spans,
)
from slime_search_r1.training.staleness import newest_version
from slime_search_r1.viewer.samples import Run, ViewSample
from slime_search_r1.viewer.steps import steps_of, tool_calls
from slime_search_r1.viewer.summary import (
    collapse_warnings,
    hook_metrics,
    hook_prefix,
    is_training,
    log_prob_gaps,
    viewer_metrics,
)
from slime_search_r1.viewer.vocabulary import TokenTexts

ASSETS = Path(__file__).with_name("assets")
PAGE_NAME = "index.html"
# Record keys the sample view draws itself; any other key (a newer plugin's) is shown as JSON under its name.
DRAWN_RECORD_KEYS = {
    "turns",
    "invalid_actions",
    "observation_tokens",
    "truncated_observations",
    "tools",
    "tool_error",
    "engine_error",
    "template_error",
    "length_refusal",
    "finish_reason",
    "evaluation",
    "conversation",
    "reward",
    "generated_tokens",
    "resumes",
    "earlier_policy_tokens",
    "resumed_at",
    "resume",
    "versions",
    "engine_aborts",
    "aborts_after_turn_end",
    "restarts",
    "max_version_lag",
    "lag_masked_tokens",
    "forced_answer",
    "segments",
    "segment",
    "page_chunks",
    "short_form_tokens_saved",
}
_MARKER = re.compile(r"<!--VIEWER:(\w+)-->|/\*VIEWER:(\w+)\*/")
_SMALL_TENSOR = 64  # elements; bigger tensors are shown by shape


def json_safe(value, depth: int = 0):
    """Anything a dump holds as something JSON can carry: tensors by value (small) or shape, NaN as text."""
    if depth > 50:
        return repr(value)
    if isinstance(value, Enum):
        return json_safe(value.value, depth + 1)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v, depth + 1) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "shape"):  # torch tensors, numpy arrays
        numel = int(np.prod(value.shape)) if len(value.shape) else 1
        if numel <= _SMALL_TENSOR:
            return json_safe(value.tolist(), depth + 1)
        return {"tensor": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, bytes):
        return repr(value)
    return repr(value)


def script_json(value) -> str:
    """JSON that is safe inside a <script> block: no <, > or & (so no </script>, no <!--), no line separators."""
    text = json.dumps(json_safe(value), ensure_ascii=False, separators=(",", ":"))
    for char in ("<", ">", "&", "\u2028", "\u2029"):
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def typed(values, dtype: str) -> str | float:
    """A list as base64 of a little-endian typed array ("<i4", "<f4", "|u1"); a constant float series as one number."""
    array = np.asarray(values, dtype=dtype)
    if dtype == "<f4" and array.size > 1 and math.isfinite(array[0]) and bool(np.all(array == array[0])):
        return float(array[0])
    return base64.b64encode(array.tobytes()).decode("ascii")


def question_of(prompt) -> str:
    """The question of a Search-R1 prompt (string or messages), for the sample list."""
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users and isinstance(users[-1], str) else ""
    text = str(prompt)
    if "Question:" in text:
        text = text.rsplit("Question:", 1)[1].split("<|", 1)[0]  # up to the chat template's end-of-turn marker
    return " ".join(text.split())[:200]


def answers_of(label) -> list[str] | None:
    try:
        return golden_answers(label)
    except (ValueError, TypeError):
        return None


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return json_safe(float(value))
    return None


def versions_view(record: dict | None, response_length: int) -> dict | None:
    """The weight versions that sampled the response: each distinct one (oldest first; unordered ones last) with
    how far it lags the episode's newest, and the spans as [start, end, its index] in the sample's response (a part
    of a split episode shows its own). None: none recorded."""
    spans = part_spans(record, response_length) if record else []
    if not spans:
        return None

    def order(version) -> tuple:
        number = version_number(version)
        return (number is None, number or 0, str(version))

    names = sorted({version for _, _, version in spans}, key=order)
    newest = newest_version(version_spans(record))
    lags = [None if (n := version_number(v)) is None or newest is None else newest - n for v in names]
    return {
        "names": names,
        "lags": lags,
        "spans": [[start, end, names.index(version)] for start, end, version in spans],
    }


def sample_row(sample: ViewSample) -> dict:
    """What the sample list shows and filters on."""
    record = sample.record or {}
    reward = reward_of(record) or {}
    tools = tool_counters(record)
    gaps = log_prob_gaps(sample)
    slime_reward = _number(sample.reward)
    if slime_reward is None and isinstance(sample.reward, dict):
        slime_reward = _number(sample.reward.get("score"))
    return {
        "p": sample.position,
        "index": sample.index,
        "group": sample.group_index,
        "status": sample.status,
        "finish": record.get("finish_reason"),
        "reward": slime_reward if slime_reward is not None else _number(reward.get("score")),
        "em": _number(reward.get("em")),
        "fv": _number(reward.get("format_valid")),
        "rh": _number(reward.get("retrieval_hit")),
        "source": sample.metadata.get("data_source"),
        "turns": record.get("turns"),
        "tools": {name: [c.get("calls", 0), c.get("failures", 0)] for name, c in tools.items()},
        "failed_call": any(c.get("failures", 0) for c in tools.values()) or bool(record.get("tool_error")),
        "truncated": sample.status == "truncated",
        "len": sample.response_length,
        "removed": sample.remove_sample,
        "q": question_of(sample.prompt),
        "answer": sample.answer,
        "answers": answers_of(sample.label),
        "gap": max(gaps) if gaps else None,
        "tokens": sample.response_ids is not None,
        "resumes": record.get("resumes") or 0,  # --partial-rollout: rollouts this episode spans, less one
    }


def sample_detail(sample: ViewSample, texts: TokenTexts | None, training: bool = True) -> dict:
    """Everything the sample view draws, parsed only when the sample is opened; an evaluation's (not `training`)
    without the weight versions (one policy samples an evaluation: training_metrics)."""
    record = sample.record
    if sample.response_ids is not None and texts is not None:
        texts.learn(sample.prompt_ids or [])
        texts.learn(sample.response_ids)
    steps = steps_of(sample, texts.vocabulary if texts else None)
    detail = {
        "prompt": sample.prompt,
        # the response text only where the page cannot spell it from the tokens
        "response": sample.response if sample.response_ids is None or texts is None else None,
        "steps": [[s.kind, s.start, s.end] if s.start is not None else [s.kind, s.text] for s in steps],
        "tool_calls": tool_calls(sample, steps),
        "conversation": conversation_of(record) if record else None,
        "record": record,
        "record_more": {k: v for k, v in (record or {}).items() if k not in DRAWN_RECORD_KEYS},
        "label": sample.label,
        "answers": answers_of(sample.label),
        "reward": sample.reward,
        "fields": {
            "index": sample.index,
            "group_index": sample.group_index,
            "remove_sample": sample.remove_sample,
            "metadata": {k: v for k, v in sample.metadata.items() if k != "search_r1"},
            **sample.other,
        },
        "train_fields": sample.train_fields,
        # --partial-rollout: the response tokens before this position were sampled in earlier rollouts
        "earlier_before": (record.get("resumed_at") or [0])[-1] if record else 0,
        "versions": versions_view(record, sample.response_length) if training else None,
    }
    if sample.response_ids is not None:
        detail["prompt_ids"] = typed(sample.prompt_ids or [], "<i4")
        detail["response_ids"] = typed(sample.response_ids, "<i4")
        detail["n"] = len(sample.response_ids)
    if sample.loss_mask is not None:
        detail["loss_mask"] = typed(sample.loss_mask, "|u1")
    series = {}
    if sample.rollout_log_probs is not None and len(sample.rollout_log_probs) == sample.response_length:
        series["rollout_log_probs"] = typed(sample.rollout_log_probs, "<f4")
    for name, values in sample.series.items():
        if name == "loss_masks" and values == sample.loss_mask:
            continue  # what slime trained is what the rollout recorded: the colours say it already
        series[name] = typed(values, "<f4")
    detail["series"] = series
    return detail


def shown_samples(samples: list[ViewSample], per_source: int | None) -> list[ViewSample]:
    """The first `per_source` samples of each data source (all when None)."""
    if per_source is None:
        return samples
    taken: dict = {}
    kept = []
    for sample in samples:
        source = sample.metadata.get("data_source")
        if taken.get(source, 0) < per_source:
            taken[source] = taken.get(source, 0) + 1
            kept.append(sample)
    return kept


def render_page(
    runs: list[Run],
    *,
    tokenizer=None,
    tokenizer_name: str | None = None,
    title: str = "Search-R1 trajectories",
    threshold: float = 0.5,
    per_source: int | None = None,
    warnings: list[str] | None = None,
) -> str:
    texts = TokenTexts(tokenizer) if tokenizer is not None else None
    blocks: list[str] = []
    page_runs = []
    hooks = [hook_metrics(run) for run in runs]
    alarms = collapse_warnings(runs, hooks)
    for run_index, run in enumerate(runs):
        shown = shown_samples(run.samples, per_source)
        for sample in shown:
            detail = sample_detail(sample, texts, is_training(run))
            blocks.append(
                f'<script type="application/json" id="d-{run_index}-{sample.position}">{script_json(detail)}</script>'
            )
        page_runs.append(
            {
                "name": run.name,
                "kind": run.kind,
                "source": run.source,
                "rollout_id": run.rollout_id,
                "train_sources": run.train_sources,
                "notes": run.notes,
                "total": len(run.samples),
                "prefix": hook_prefix(run),
                "hooks": hooks[run_index],
                "alarms": alarms[run_index],  # the early warnings of a collapse the log hook gave this rollout
                "viewer": viewer_metrics(run, threshold),
                "rows": [sample_row(sample) for sample in shown],
            }
        )
    vocabulary = texts.vocabulary if texts else None
    data = {
        "title": title,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "tokenizer": tokenizer_name,
        "threshold": threshold,
        "per_source": per_source,
        "warnings": warnings or [],
        "runs": page_runs,
        "vocab": {
            "t": {str(i): t for i, t in sorted(vocabulary.texts.items())} if vocabulary else {},
            "b": {str(i): base64.b64encode(b).decode() for i, b in sorted(vocabulary.partial.items())}
            if vocabulary
            else {},
            "s": sorted(vocabulary.special) if vocabulary else [],
        },
    }
    script = (ASSETS / "viewer.js").read_text(encoding="utf-8")
    parts = {
        "TITLE": html.escape(title),
        "CSS": (ASSETS / "viewer.css").read_text(encoding="utf-8"),
        "JS": script,
        # the Content-Security-Policy lets only this script run, whatever ended up in the page
        "SCRIPT_HASH": "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode(),
        "DATA": script_json(data),
        "SAMPLES": "\n".join(blocks),
    }
    template = (ASSETS / "page.html").read_text(encoding="utf-8")
    return _MARKER.sub(lambda match: parts[match.group(1) or match.group(2)], template)


def write_page(output_dir: Path, page: str) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / PAGE_NAME
    path.write_text(page, encoding="utf-8")
    return path
