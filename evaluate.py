"""Evaluate a policy on Search-R1's test sets with the plugin's own generate() and reward_func().

    python evaluate.py --data /root/Search-R1/data/nq_hotpotqa_train/test.parquet \\
        --hf-checkpoint /root/Qwen2.5-3B --sglang-url http://127.0.0.1:30000 --output-dir eval/qwen2.5-3b

Every row goes through generate_with_search.generate(..., evaluation=True) against a running SGLang server
(or router) and the configured search backend, exactly as slime's in-training evaluation does, then
reward_func() scores it (pure exact match in evaluation); F1 and cover EM are computed over the same answer, and
an LLM judge behind any OpenAI-compatible endpoint gives its verdict with --judge-url and --judge-model.
Writes, under --output-dir:
  trajectories.jsonl  one line per finished sample, written as it finishes (rerun the command to resume);
                      evaluation/runner.py's trajectory_record says what a line holds
  judgements.jsonl    the judge's raw verdicts, one line per answer (with --judge-url)
  results.md / .json  every score per data source and their mean (Search-R1's "Avg")
  em_by_source.png    the same as a bar chart
  viewer/index.html   with --viewer: every trajectory token by token, offline (python -m slime_search_r1.viewer)
--samples-per-question K samples each question K times and reports avg@K and pass@K. --reference NAME or FILE puts
a paper's figures beside the run's. The plugin's environment variables (RETRIEVAL_SERVER_URL, SEARCH_R1_MAX_TURNS,
...) apply as in training.

Several evaluations, one per checkpoint, side by side; and one scored again without generating:

    python evaluate.py compare eval/step_100 eval/step_200 eval/step_300 --output eval/comparison
    python evaluate.py rescore eval/step_300 --judge-url http://127.0.0.1:8000/v1 --judge-model Qwen2.5-72B-Instruct

The evaluation is slime_search_r1/evaluation/ (cli.py: the commands; arguments.py: their command lines; runner.py:
the run; judging.py: the judge's pass; reports.py, chart.py, comparison.py: the reports); this file loads the plugin
it evaluates and hands the run's folder to the viewer (slime_search_r1/viewer), which reads what the evaluation wrote.
"""

import importlib
import sys
from pathlib import Path

from slime_search_r1.install_hint import needs_extra

with needs_extra("evaluate.py", "data"):
    from slime_search_r1.evaluation import cli
    from slime_search_r1.evaluation.arguments import parse_args  # noqa: F401 (a printed evaluate.py line is checked with it)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, load_plugin, write_viewer)


def load_plugin():
    """generate_with_search (the settings and hooks being evaluated) and slime's Sample. Without slime, slime's
    stand-in in this checkout (tests/slime_stub, as make rollout-demo uses it), said so; exit 2 without either."""
    try:
        importlib.import_module("slime.utils.types")
    except ImportError as exc:
        from slime_search_r1.standin import SLIME_STUB, use_slime_stub

        if not use_slime_stub():
            print(
                f"evaluate.py: error: slime is not importable ({exc}); run it in slime's environment "
                "(pip install -e /root/slime), or offline from a checkout of this plugin, whose tests/slime_stub "
                "stands in for slime (make rollout-demo)",
                file=sys.stderr,
            )
            raise SystemExit(2) from None  # 2 = bad environment or input, as for unreachable servers
        print(
            f"evaluate.py: slime is not installed here: using its stand-in {SLIME_STUB} (only the names the plugin "
            "imports, see its README.md); in slime's environment slime itself is used",
            file=sys.stderr,
        )
    plugin = importlib.import_module("generate_with_search")
    from slime.utils.types import Sample

    return plugin, Sample


def write_viewer(output_dir: Path, hf_checkpoint: str, tokenizer, per_source: int) -> None:
    """output_dir/viewer/index.html, the viewer's page of this run (--viewer), with the run's own tokenizer when it
    generated (else the checkpoint's); a page that cannot be written is a warning, the evaluation stands."""
    from slime_search_r1.viewer import InputError, TokenizerError, build_page  # numpy and the page: only for --viewer

    model = Path(str(hf_checkpoint)).name or str(hf_checkpoint)
    try:
        built = build_page(
            [output_dir],
            output_dir / "viewer",
            tokenizer=tokenizer,
            tokenizer_path=None if tokenizer is not None else Path(hf_checkpoint),
            title=f"evaluate.py: {model}",
            per_source=per_source,
        )
    except (InputError, TokenizerError) as exc:
        print(f"evaluate.py: warning: no viewer page: {exc}", file=sys.stderr)
        return
    print(f"evaluate.py: viewer page {built.path} ({built.size / 1e6:.1f} MB; open it in a browser)", file=sys.stderr)


if __name__ == "__main__":
    with needs_extra("evaluate.py", "data"):  # pyarrow and tqdm are imported when a run reads its data
        sys.exit(main())
