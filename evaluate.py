"""Evaluate a policy on Search-R1's test sets with the plugin's own generate() and reward_func().

    python evaluate.py --data /root/Search-R1/data/nq_hotpotqa_train/test.parquet \\
        --hf-checkpoint /root/Qwen2.5-3B --sglang-url http://127.0.0.1:30000 --output-dir eval/qwen2.5-3b

Every row goes through generate_with_search.generate(..., evaluation=True) against a running SGLang server
(or router) and the configured search backend, exactly as slime's in-training evaluation does, then
reward_func() scores it (pure exact match in evaluation); F1 and cover EM are computed over the same answer, and
an LLM judge behind any OpenAI-compatible endpoint gives its verdict with --judge-url and --judge-model.
Writes, under --output-dir:
  trajectories.jsonl  one line per finished sample, written as it finishes (rerun the command to resume)
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

The evaluation is slime_search_r1/evaluation/ (cli.py: these command lines; runner.py: the run; reports.py: the
reports); this file loads the plugin it evaluates.
"""

import importlib
import sys

from slime_search_r1.evaluation import cli
from slime_search_r1.evaluation.cli import parse_args  # noqa: F401 (the launch script's command line is read with it)
from slime_search_r1.evaluation.runner import trajectory_record  # noqa: F401 (what one trajectories.jsonl line holds)


def load_plugin():
    """generate_with_search (the settings and hooks being evaluated) and slime's Sample; exit 2 without slime."""
    try:
        importlib.import_module("slime.utils.types")
    except ImportError as exc:
        print(
            f"evaluate.py: error: slime is not importable ({exc}); run it in slime's environment "
            "(pip install -e /root/slime), or offline with slime's stand-in on the path as make rollout-demo runs it "
            "(PYTHONPATH=tests/slime_stub)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None  # 2 = bad environment or input, as for unreachable servers
    plugin = importlib.import_module("generate_with_search")
    from slime.utils.types import Sample

    return plugin, Sample


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, load_plugin)


if __name__ == "__main__":
    sys.exit(main())
