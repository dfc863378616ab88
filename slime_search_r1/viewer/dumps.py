"""slime's debug dumps, loaded without running code they carry, and joined: rollout and train sides of a rollout.

--save-debug-rollout-data writes, per rollout, torch.save({"rollout_id": id, "samples": [Sample.to_dict(), ...]})
(evaluation rollouts to the same template with the id "eval_<id>"); --save-debug-train-data writes, per rollout, one
file of the train side: {"format_version": 2, "rollout_id", "samples": [per-sample dicts], "dp_shards", ...} whose
samples name their rollout-dump sample by "rollout_position" (slime/observability/train_data_utils.py).

Loading: torch.load(weights_only=True) only. Sample.to_dict() holds plain Python values (status as its string, the
spec and prefix-cache counters as dicts) and tensors (top-p replay, routed experts), and the train dump holds tensors
and plain values, so weights_only reads both whole. A file that holds any other type is refused with torch's reason;
--allow-global MODULE.NAME allows exactly that type, for this load only.
"""

import importlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slime_search_r1.scoring.answers import answer_of
from slime_search_r1.viewer.samples import Run, ViewSample

ROLLOUT_FORMAT = "a slime rollout dump (--save-debug-rollout-data: {'rollout_id': ..., 'samples': [Sample.to_dict()]})"
TRAIN_FORMAT = "a slime train dump (--save-debug-train-data: {'format_version': 2, 'samples': [...], 'dp_shards'})"
# Sample.to_dict() fields the viewer reads itself; every other one is shown as it is.
_READ_FIELDS = {
    "tokens",
    "response_length",
    "status",
    "prompt",
    "response",
    "metadata",
    "label",
    "reward",
    "index",
    "group_index",
    "remove_sample",
    "loss_mask",
    "rollout_log_probs",
    "teacher_log_probs",
}
# Per-sample keys of the train dump that say which sample it is (the rest is its data).
_TRAIN_IDS = ("rollout_position", "sample_index", "data_parallel_rank")


class InputError(ValueError):
    """An input the viewer cannot read; the message names the file and what was expected."""


def allowed_global(dotted: str):
    """MODULE.NAME -> the object, for --allow-global (imported because the user named it)."""
    module_name, _, name = dotted.rpartition(".")
    if not module_name:
        raise InputError(f"--allow-global {dotted}: expected MODULE.NAME, e.g. numpy.dtype")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"--allow-global {dotted}: cannot import it ({exc})") from None


def load_torch_file(path: Path, allowed: Iterable[Any] = ()) -> Any:
    """torch.load(weights_only=True), with `allowed` added to its allow-list for this call only."""
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if refused is None:
            raise InputError(f"{path}: not a file written by torch.save ({str(exc).splitlines()[0]})") from None
        raise InputError(
            f"{path}: holds {refused.group(1)}, which torch.load(weights_only=True) does not load (slime's dumps hold "
            f"only plain values and tensors); if you trust this file, allow exactly that type with "
            f"--allow-global {refused.group(1)}"
        ) from None
    except Exception as exc:  # torch raises RuntimeError, KeyError, EOFError, ... on a file it did not write
        raise InputError(f"{path}: not a file written by torch.save ({type(exc).__name__}: {exc})") from None


def to_list(value) -> list | None:
    """A tensor, numpy array or list as a plain list (None stays None)."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        return value.tolist()
    return list(value)


def is_rollout_dump(payload) -> bool:
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("samples"), list)
        and "rollout_id" in payload
        and "format_version" not in payload
        and all(isinstance(s, dict) and "tokens" in s and "status" in s for s in payload["samples"])
    )


def is_train_dump(payload) -> bool:
    return isinstance(payload, dict) and "format_version" in payload and isinstance(payload.get("samples"), list)


def is_evaluation_dump(path: Path, payload: dict) -> bool:
    """slime writes evaluation rollouts to its template with the id "eval_<id>"."""
    return f"eval_{payload['rollout_id']}" in path.name


def sample_from_dict(position: int, data: dict) -> ViewSample:
    """One Sample.to_dict() as the viewer sees it."""
    tokens = to_list(data.get("tokens")) or []
    response_length = int(data.get("response_length") or 0)
    cut = len(tokens) - response_length
    status = data.get("status")
    sample = ViewSample(
        position=position,
        status=str(getattr(status, "value", status)),
        prompt=data.get("prompt") or "",
        response=data.get("response") or "",
        response_length=response_length,
        metadata=dict(data.get("metadata") or {}),
        label=data.get("label"),
        reward=data.get("reward"),
        index=data.get("index"),
        group_index=data.get("group_index"),
        remove_sample=bool(data.get("remove_sample")),
        prompt_ids=tokens[:cut] if cut >= 0 else None,
        response_ids=tokens[cut:] if cut >= 0 else None,
        loss_mask=to_list(data.get("loss_mask")),
        rollout_log_probs=to_list(data.get("rollout_log_probs")),
        other={key: value for key, value in data.items() if key not in _READ_FIELDS},
    )
    sample.answer = answer_of(sample)  # a dump does not name the enabled tools: read as with search alone
    teacher = to_list(data.get("teacher_log_probs"))
    if teacher is not None and len(teacher) == response_length:
        sample.series["teacher_log_probs"] = [float(v) for v in teacher]
    return sample


def read_rollout_dump(path: Path, payload: dict) -> Run:
    evaluation = is_evaluation_dump(path, payload)
    rollout_id = payload["rollout_id"]
    notes = []
    if evaluation:
        notes.append(
            "slime's evaluation dump holds the samples of every eval dataset in one list: these figures are over all "
            "of them, where the hooks log each dataset apart"
        )
    return Run(
        name=f"{'eval' if evaluation else 'rollout'} {rollout_id}",
        kind="eval" if evaluation else "rollout",
        source=str(path),
        samples=[sample_from_dict(i, data) for i, data in enumerate(payload["samples"])],
        rollout_id=rollout_id if isinstance(rollout_id, int) else None,
        notes=notes,
    )


def check_train_dump(path: Path, payload: dict) -> None:
    if payload.get("format_version") != 2:
        raise InputError(
            f"{path}: train dump format_version {payload.get('format_version')!r}; the viewer reads version 2 "
            "(slime since THUDM/slime#2266)"
        )
    for i, sample in enumerate(payload["samples"]):
        if not isinstance(sample, dict) or not any(key in sample for key in ("rollout_position", "sample_index")):
            missing = f"train sample {i} has no rollout_position or sample_index"
            raise InputError(f"{path}: {missing}; expected {TRAIN_FORMAT}")


def join_train_dump(run: Run, path: Path, payload: dict) -> None:
    """Put the train side of each sample on it: every per-token value (log_probs, ref_log_probs, advantages,
    entropy, ...) as a series, the rest as fields. A train sample whose tokens are not its rollout sample's is left
    out and noted (a dump from another run)."""
    by_index = {s.index: s for s in run.samples if s.index is not None}
    joined, mismatched = 0, []
    for train in payload["samples"]:
        position = train.get("rollout_position")
        if isinstance(position, int) and 0 <= position < len(run.samples):
            sample = run.samples[position]
        else:
            sample = by_index.get(train.get("sample_index"))
        if sample is None:
            mismatched.append(f"no rollout sample at position {position} / index {train.get('sample_index')}")
            continue
        tokens = to_list(train.get("tokens"))
        if tokens is not None and sample.prompt_ids is not None and tokens != sample.prompt_ids + sample.response_ids:
            mismatched.append(f"sample {sample.position}: its tokens differ from the rollout dump's")
            continue
        for key, value in train.items():
            if key in _TRAIN_IDS or key == "tokens" or (key == "rollout_log_probs" and sample.rollout_log_probs):
                continue  # which sample it is, or what the rollout dump holds already
            values = to_list(value) if hasattr(value, "tolist") or isinstance(value, (list, tuple)) else None
            if isinstance(values, list) and len(values) == sample.response_length and _numbers(values):
                sample.series[key] = [float(v) for v in values]
            else:
                sample.train_fields[key] = values if isinstance(values, list) else value
        sample.train_fields["dump"] = str(path)
        joined += 1
    run.train_sources.append(str(path))
    run.notes.append(f"train dump {path}: {joined} of {len(payload['samples'])} samples joined")
    if mismatched:
        run.notes.append(f"train dump {path}: not joined: " + "; ".join(mismatched[:5]))


def _numbers(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
