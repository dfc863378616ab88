"""python -m slime_search_r1.viewer INPUT... --output DIR: one self-contained page of slime dumps and evaluate.py runs.

    python -m slime_search_r1.viewer /data/dumps --output /data/dumps/viewer          # a --dump-details folder
    python -m slime_search_r1.viewer /data/dumps --rollouts ::50 --output viewer/     # every 50th rollout
    python -m slime_search_r1.viewer dumps/rollout_data/40.pt dumps/train_data/40.pt --tokenizer /root/Qwen2.5-3B \\
        --output viewer/
    python -m slime_search_r1.viewer eval/step_100 --output eval/step_100/viewer     # an evaluate.py --output-dir

Exit codes: 0 written, 2 an input or the tokenizer cannot be read (the message names the file).
"""

import argparse
import sys
from pathlib import Path

from slime_search_r1.viewer.build import build_page
from slime_search_r1.viewer.dumps import InputError, allowed_global
from slime_search_r1.viewer.inputs import rollouts_spec
from slime_search_r1.viewer.vocabulary import TokenizerError


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m slime_search_r1.viewer",
        description="Write one offline HTML page of slime rollout dumps (--save-debug-rollout-data), the train dumps "
        "beside them (--save-debug-train-data) and evaluate.py output folders.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "inputs", nargs="+", type=Path, metavar="INPUT", help="dump files, folders holding them, evaluate.py folders"
    )
    parser.add_argument("--output", required=True, type=Path, help="folder for index.html")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="Hugging Face tokenizer folder (the checkpoint's) for the tokens' text; default: a tokenizer/ folder "
        "beside the dumps (slime's --dump-details saves one) or an evaluate.py run's checkpoint",
    )
    parser.add_argument("--title", default="Search-R1 trajectories")
    parser.add_argument(
        "--logprob-diff-threshold",
        type=non_negative_float,
        default=0.5,
        help="mark trained tokens whose train and rollout log probs differ by more (changeable on the page)",
    )
    parser.add_argument(
        "--rollouts",
        default=None,
        metavar="SPEC",
        help="which rollouts' dumps to read (slime writes one per rollout): ids (10,20) or a slice of the ids found "
        "(--rollouts=-1: the latest, ::50 every 50th); evaluate.py folders are always read",
    )
    parser.add_argument(
        "--max-samples-per-source",
        type=positive_int,
        default=None,
        help="put only the first N samples of each data source on the page (the figures still count all)",
    )
    parser.add_argument(
        "--allow-global",
        action="append",
        default=[],
        metavar="MODULE.NAME",
        help="a type a dump holds that torch.load(weights_only=True) refuses, allowed for these loads only "
        "(only for files you trust; slime's own dumps need none)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    cli = parse_args(argv)
    try:
        built = build_page(
            cli.inputs,
            cli.output,
            tokenizer_path=cli.tokenizer,
            title=cli.title,
            threshold=cli.logprob_diff_threshold,
            per_source=cli.max_samples_per_source,
            allowed_globals=[allowed_global(name) for name in cli.allow_global],
            rollouts=rollouts_spec(cli.rollouts) if cli.rollouts is not None else None,
        )
    except (InputError, TokenizerError) as exc:
        print(f"viewer: error: {exc}", file=sys.stderr)
        return 2
    for warning in built.warnings:
        print(f"viewer: warning: {warning}", file=sys.stderr)
    samples = sum(len(run.samples) for run in built.runs)
    print(
        f"viewer: {built.path} ({built.size / 1e6:.1f} MB): {len(built.runs)} runs, {samples} samples; "
        "open it in a browser (no server needed)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
