"""From the command line's INPUT paths to runs: which files are slime dumps, which folders evaluate.py runs, and
which train dump belongs to which rollout dump.

A folder is searched for both (slime's --dump-details writes rollout_data/ and train_data/ under one folder, with the
tokenizer beside them in tokenizer/). A file is read by what it holds, not by its name.
"""

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from slime_search_r1.evaluation.store import TRAJECTORIES
from slime_search_r1.viewer.dumps import (
    ROLLOUT_FORMAT,
    TRAIN_FORMAT,
    InputError,
    check_train_dump,
    is_rollout_dump,
    is_train_dump,
    join_train_dump,
    load_torch_file,
    read_rollout_dump,
)
from slime_search_r1.viewer.samples import Run
from slime_search_r1.viewer.trajectories import read_evaluate_run

KIND_ORDER = {"rollout": 0, "eval": 1, "evaluate": 2}


@dataclass
class Inputs:
    runs: list[Run]
    tokenizer_dirs: list[Path] = field(default_factory=list)  # tokenizer/ folders found beside the dumps
    warnings: list[str] = field(default_factory=list)


def find_inputs(paths: Iterable[Path]) -> tuple[list[Path], list[Path], list[Path]]:
    """(torch files, evaluate.py folders, tokenizer folders) under the given paths, each once, in a stable order."""
    files: dict[Path, None] = {}
    folders: dict[Path, None] = {}
    tokenizers: dict[Path, None] = {}
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_file():
            if path.name == TRAJECTORIES:
                folders[path.parent] = None
            else:
                files[path] = None
            # --dump-details keeps the tokenizer one level up from rollout_data/<id>.pt
            for candidate in (path.parent / "tokenizer", path.parent.parent / "tokenizer"):
                if candidate.is_dir():
                    tokenizers[candidate] = None
            continue
        found_files = sorted(path.rglob("*.pt"), key=_natural)
        found_runs = sorted(p.parent for p in path.rglob(TRAJECTORIES))
        if not found_files and not found_runs:
            raise InputError(f"{path}: no slime dump (*.pt) and no evaluate.py {TRAJECTORIES} under it")
        files.update(dict.fromkeys(found_files))
        folders.update(dict.fromkeys(found_runs))
        tokenizers.update(dict.fromkeys(p for p in sorted(path.rglob("tokenizer")) if p.is_dir()))
    return list(files), list(folders), list(tokenizers)


def _natural(path: Path) -> list:
    """rollout_data/10.pt after rollout_data/9.pt."""
    digits = "".join(c if c.isdigit() else " " for c in path.name).split()
    return [str(path.parent), int(digits[-1]) if digits else -1, path.name]


def rollouts_spec(spec: str) -> Callable[[list[int]], set[int]]:
    """--rollouts: "10,20" those rollout ids; "START:STOP:STEP" a slice of the ids found, in order ("-1:" the
    latest, written --rollouts=-1: on a command line; "::50" every 50th). slime writes a dump for every rollout; this
    picks which ones the page shows."""
    try:
        if ":" in spec:
            parts = spec.split(":")
            if len(parts) > 3:
                raise ValueError
            chosen = slice(*(int(part) if part.strip() else None for part in parts))
            if chosen.step == 0:
                raise ValueError
            return lambda ids: set(sorted(ids)[chosen])
        wanted = {int(part) for part in spec.split(",")}
        return lambda ids: wanted & set(ids)
    except ValueError:
        raise InputError(
            f"--rollouts {spec!r}: expected rollout ids (10,20) or a slice of them (START:STOP:STEP, e.g. -1: or ::50)"
        ) from None


def rollout_id_in_name(path: Path) -> int | None:
    """The rollout id slime's template put in a dump's name: the number after eval_, else the name's first number."""
    match = re.search(r"eval_(\d+)", path.name) or re.search(r"(\d+)", path.stem)
    return int(match.group(1)) if match else None


def select_rollouts(files: list[Path], rollouts: Callable[[list[int]], set[int]]) -> list[Path]:
    named = {path: rollout_id_in_name(path) for path in files}
    found = sorted({i for i in named.values() if i is not None})
    chosen = rollouts(found)
    if not chosen:
        raise InputError(f"--rollouts chose none of the rollout ids the dumps' names hold ({_ranges(found)})")
    return [path for path in files if named[path] is None or named[path] in chosen]


def _ranges(ids: list[int]) -> str:
    if not ids:
        return "none"
    return ", ".join(map(str, ids)) if len(ids) <= 6 else f"{len(ids)} ids from {ids[0]} to {ids[-1]}"


def read_inputs(paths: Iterable[Path], allowed_globals=(), rollouts: Callable | None = None) -> Inputs:
    """The runs in `paths`; `rollouts` (rollouts_spec) picks which rollouts' dumps are read."""
    files, folders, tokenizers = find_inputs([Path(p) for p in paths])
    if rollouts is not None and files:
        files = select_rollouts(files, rollouts)
    runs: list[Run] = []
    train_dumps: list[tuple[Path, dict]] = []
    for path in files:
        payload = load_torch_file(path, allowed_globals)
        if is_train_dump(payload):
            check_train_dump(path, payload)
            train_dumps.append((path, payload))
        elif is_rollout_dump(payload):
            runs.append(read_rollout_dump(path, payload))
        else:
            raise InputError(f"{path}: not {ROLLOUT_FORMAT} nor {TRAIN_FORMAT}; found {_describe(payload)}")
    runs += [read_evaluate_run(folder) for folder in folders]
    inputs = Inputs(runs=runs, tokenizer_dirs=tokenizers)
    for path, payload in train_dumps:
        _join(inputs, path, payload)
    runs.sort(key=lambda run: (KIND_ORDER[run.kind], run.rollout_id if run.rollout_id is not None else -1, run.source))
    return inputs


def _join(inputs: Inputs, path: Path, payload: dict) -> None:
    """A train dump joins the training rollout dump of its rollout_id; if several inputs have that id, the one in
    the same folder or a sibling folder (--dump-details' rollout_data/ beside train_data/)."""
    rollout_id = payload.get("rollout_id")
    candidates = [run for run in inputs.runs if run.kind == "rollout" and run.rollout_id == rollout_id]
    if len(candidates) > 1:
        near = [run for run in candidates if Path(run.source).parent.parent == path.parent.parent]
        candidates = near if len(near) == 1 else candidates
    if len(candidates) != 1:
        what = "no rollout dump" if not candidates else f"{len(candidates)} rollout dumps"
        inputs.warnings.append(f"{path}: {what} with rollout_id {rollout_id} among the inputs; not shown")
        return
    join_train_dump(candidates[0], path, payload)


def _describe(payload) -> str:
    if isinstance(payload, dict):
        return "a dict with keys " + ", ".join(map(repr, list(payload)[:8]))
    return type(payload).__name__
