"""evaluate.py's output folders: trajectories.jsonl, one line per finished sample (evaluation/store.py names the
files, evaluation/runner.py's trajectory_record writes the lines).

A line always holds the response text, the status, the reward's parts and the tool counters. Written with
`evaluate.py --viewer` it also holds the prompt, the plugin's whole record ("episode") and the token ids, loss mask
and log probs ("tokens"), so the page shows every token; a line without them is shown as text.
"""

import json
from pathlib import Path

from slime_search_r1.episode import METADATA_KEY
from slime_search_r1.evaluation.store import RUN_CONFIG, TRAJECTORIES, TrajectoryStore
from slime_search_r1.evaluation.summary import model_name
from slime_search_r1.scoring.answers import answer_of
from slime_search_r1.viewer.dumps import InputError
from slime_search_r1.viewer.samples import Run, ViewSample

# Line keys the viewer reads itself; every other one is shown as it is.
_READ_KEYS = {"status", "response", "response_length", "data_source", "golden_answers", "answer", "score", "prompt"}
_REWARD_KEYS = ("score", "em", "format_valid", "retrieval_hit")


def episode_of(line: dict) -> dict:
    """The plugin's record: as evaluate.py --viewer wrote it, or rebuilt from the line's own counters."""
    episode = line.get("episode")
    if isinstance(episode, dict):
        return episode
    return {
        "turns": line.get("turns", 0),
        "tools": line.get("tools") or {},
        "finish_reason": line.get("finish_reason"),
        "tool_error": line.get("tool_error"),
        "evaluation": True,
        "reward": {key: line.get(key) for key in _REWARD_KEYS},
    }


def sample_from_line(position: int, line: dict) -> ViewSample:
    tokens = line.get("tokens") if isinstance(line.get("tokens"), dict) else {}
    sample = ViewSample(
        position=position,
        status=str(line.get("status")),
        prompt=line.get("prompt") or line.get("question") or "",
        response=line.get("response") or "",
        response_length=int(line.get("response_length") or 0),
        metadata={"data_source": line.get("data_source"), METADATA_KEY: episode_of(line)},
        label=line.get("golden_answers"),
        reward=line.get("score"),
        index=line.get("index"),
        prompt_ids=tokens.get("prompt_ids"),
        response_ids=tokens.get("response_ids"),
        loss_mask=tokens.get("loss_mask"),
        rollout_log_probs=tokens.get("rollout_log_probs"),
        other={key: value for key, value in line.items() if key not in _READ_KEYS | {"tokens", "episode"}},
    )
    # evaluate.py wrote the answer it scored, read with the run's enabled tools; a line without one is read here
    sample.answer = line["answer"] if "answer" in line else answer_of(sample)
    return sample


def read_evaluate_run(folder: Path) -> Run:
    path = folder / TRAJECTORIES
    if not path.is_file():
        raise InputError(f"{folder}: no {TRAJECTORIES}; expected an evaluate.py --output-dir")
    lines = list(TrajectoryStore(folder).load().values())  # the latest line of each row (a resumed run rewrites)
    if not lines and path.stat().st_size > 0:
        raise InputError(f"{path}: no line is a JSON object with a 'key'; expected evaluate.py's {TRAJECTORIES}")
    name = folder.resolve().name
    config_path = folder / RUN_CONFIG
    notes = []
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        scripted = any(line.get("scripted") for line in lines)
        model = model_name(config.get("hf_checkpoint"), True) if scripted else config.get("hf_checkpoint")
        notes.append(f"model {model}, data {config.get('data')}")
    if lines and not any(isinstance(line.get("tokens"), dict) for line in lines):
        notes.append("no token ids in these trajectories (run evaluate.py with --viewer to record them): text only")
    return Run(
        name=f"evaluate {name}",
        kind="evaluate",
        source=str(folder),
        samples=[sample_from_line(i, line) for i, line in enumerate(lines)],
        notes=notes,
    )
