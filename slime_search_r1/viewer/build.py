"""From INPUT paths to the written page: read the runs, find a tokenizer for the tokens' text, render, write."""

import json
from dataclasses import dataclass
from pathlib import Path

from slime_search_r1.evaluation.store import RUN_CONFIG
from slime_search_r1.standin import SCRIPTED_LABEL
from slime_search_r1.viewer.inputs import read_inputs
from slime_search_r1.viewer.page import render_page, write_page
from slime_search_r1.viewer.samples import Run
from slime_search_r1.viewer.vocabulary import TokenizerError, load_tokenizer


@dataclass
class Built:
    path: Path
    runs: list[Run]
    tokenizer: str | None
    warnings: list[str]

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def tokenizer_candidates(runs: list[Run], found: list[Path]) -> list[Path]:
    """Where a tokenizer may be without being named: slime's --dump-details saves one in tokenizer/ beside the dumps;
    an evaluate.py run names its checkpoint in run_config.json."""
    candidates = list(found)
    for run in runs:
        config = Path(run.source) / RUN_CONFIG
        if run.kind == "evaluate" and config.is_file():
            checkpoint = json.loads(config.read_text(encoding="utf-8")).get("hf_checkpoint")
            if checkpoint and Path(checkpoint).is_dir():
                candidates.append(Path(checkpoint))
    return candidates


def build_page(
    inputs: list[Path],
    output_dir: Path,
    *,
    tokenizer=None,
    tokenizer_path: Path | None = None,
    title: str = "Search-R1 trajectories",
    threshold: float = 0.5,
    per_source: int | None = None,
    allowed_globals=(),
    rollouts=None,
) -> Built:
    """Read `inputs` (slime dumps, evaluate.py folders) and write output_dir/index.html.

    The tokenizer is `tokenizer` (an object), else loaded from `tokenizer_path`, else from a folder found beside the
    inputs; without one the page shows tokens by id. The title says "scripted stand-in" when one wrote any sample's
    turns. TokenizerError when a named tokenizer cannot be loaded."""
    found = read_inputs(inputs, allowed_globals, rollouts)
    warnings = list(found.warnings)
    if SCRIPTED_LABEL not in title and any(sample.scripted for run in found.runs for sample in run.samples):
        title = f"{title} ({SCRIPTED_LABEL})"
    name = None
    if tokenizer is not None:
        name = str(getattr(tokenizer, "name_or_path", "") or "given")
    elif tokenizer_path is not None:
        tokenizer, name = load_tokenizer(tokenizer_path), str(tokenizer_path)
    elif any(sample.response_ids is not None for run in found.runs for sample in run.samples):
        for candidate in tokenizer_candidates(found.runs, found.tokenizer_dirs):
            try:
                tokenizer, name = load_tokenizer(candidate), str(candidate)
                break
            except TokenizerError as exc:
                warnings.append(f"tokenizer: {exc}")
        if tokenizer is None:
            warnings.append("no tokenizer found beside the inputs: tokens are shown by id (pass --tokenizer PATH)")
    page = render_page(
        found.runs,
        tokenizer=tokenizer,
        tokenizer_name=name,
        title=title,
        threshold=threshold,
        per_source=per_source,
        warnings=warnings,
    )
    return Built(write_page(output_dir, page), found.runs, name, warnings)
