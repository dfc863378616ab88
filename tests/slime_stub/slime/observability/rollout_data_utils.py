"""Stand-in for slime.observability.rollout_data_utils: the file --save-debug-rollout-data writes per rollout."""

from pathlib import Path

import torch


def save_debug_rollout_data(path_template, data, *, rollout_id: int, evaluation: bool) -> None:
    """torch.save({"rollout_id", "samples": [Sample.to_dict()]}) at the template filled with the rollout's id
    ("eval_<id>" for an evaluation, whose `data` is {dataset: {"samples": [...], ...}})."""
    if path_template is None:
        return
    path = Path(path_template.format(rollout_id=f"eval_{rollout_id}" if evaluation else str(rollout_id)))
    path.parent.mkdir(parents=True, exist_ok=True)
    if evaluation:
        samples = [sample.to_dict() for result in data.values() for sample in result["samples"]]
    else:
        samples = [sample.to_dict() for sample in data]
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
