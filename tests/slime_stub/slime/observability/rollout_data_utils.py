"""Stand-in for slime.observability.rollout_data_utils: the file --save-debug-rollout-data writes per rollout, and
the rollout_id contract slime checks on a rollout's nested output before flattening it."""

from pathlib import Path

import torch

from slime.utils.types import Sample


def validate_rollout_id_annotated(node, depth=0):
    """slime's shape is prompt x sample (a list of lists); a generate function that returns one episode as several
    samples adds a level, and those siblings (a list of Samples at depth 2 or more) must all carry one rollout_id."""
    if isinstance(node, Sample):
        return
    assert isinstance(node, list), f"unexpected rollout output node type: {type(node).__name__}"
    if node and isinstance(node[0], Sample):
        if depth >= 2 and len(node) > 1:
            ids = [sample.rollout_id for sample in node]
            missing = [i for i, rollout_id in enumerate(ids) if rollout_id is None]
            assert not missing, f"Compact rollout returned {len(node)} samples but rollout_id is unset on {missing}."
            assert len(set(ids)) == 1, f"Sibling samples from one compact rollout must share rollout_id; got {ids}."
        return
    for item in node:
        validate_rollout_id_annotated(item, depth + 1)


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
