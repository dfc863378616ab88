"""Evaluate a policy on Search-R1's test sets with the plugin's own generate() and reward_func().

    python evaluate.py --data /root/Search-R1/data/nq_hotpotqa_train/test.parquet \\
        --hf-checkpoint /root/Qwen2.5-3B --sglang-url http://127.0.0.1:30000 --output-dir eval/qwen2.5-3b

Every row goes through generate_with_search.generate(..., evaluation=True) against a running SGLang server
(or router) and the configured search backend, exactly as slime's in-training evaluation does, then
reward_func() scores it (pure exact match in evaluation). Writes, under --output-dir:
  trajectories.jsonl  one line per finished sample, written as it finishes (rerun the command to resume)
  results.md / .json  EM per data source and their mean (Search-R1's "Avg")
  em_by_source.png    the same as a bar chart
  viewer/index.html   with --viewer: every trajectory token by token, offline (python -m slime_search_r1.viewer)
With --reference NAME (e.g. search-r1-base-grpo) the reports put the paper's EM for each data source beside this
run's, with the difference and the table each figure comes from.
The plugin's environment variables (RETRIEVAL_SERVER_URL, SEARCH_R1_MAX_TURNS, ...) apply as in training.

Several evaluations, one per checkpoint, side by side (a Markdown table and a line chart of EM per source):

    python evaluate.py compare eval/step_100 eval/step_200 eval/step_300 --output eval/comparison
"""

import argparse
import asyncio
import importlib
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from argparse import Namespace
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from slime_search_r1.settings import ConfigError, resolve_config
from slime_search_r1.evaluation.dataset import ColumnNames, DatasetError, EvalRow, build_sample, read_rows, select_rows
from slime_search_r1.evaluation.paper import REFERENCES, beside_paper, beside_paper_markdown
from slime_search_r1.evaluation.reports import (
    COMPARISON_MD,
    COMPARISON_PNG,
    RETRIED_STATUSES,
    ComparisonError,
    ResumeMismatch,
    TrajectoryStore,
    check_run_config,
    load_results,
    summarize,
    write_comparison,
    write_em_chart,
    write_reports,
)
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.episode import episode_record, tool_counters

logger = logging.getLogger("evaluate")


class PreflightError(RuntimeError):
    """A server the evaluation needs does not answer."""


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> Namespace:
    parser = argparse.ArgumentParser(
        description="Search-R1 evaluation: the plugin's generate + reward over a test file, EM per data source.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="To compare several output folders (one per checkpoint): python evaluate.py compare --help",
    )
    parser.add_argument("--data", required=True, type=Path, help="test file (.parquet or .jsonl)")
    parser.add_argument("--hf-checkpoint", required=True, help="model folder: tokenizer and chat template")
    parser.add_argument("--sglang-url", default="http://127.0.0.1:30000", help="SGLang server or router")
    parser.add_argument("--output-dir", type=Path, default=Path("eval_output"))
    parser.add_argument("--data-sources", default=None, help="comma-separated subset, e.g. nq,hotpotqa")
    parser.add_argument("--limit", type=positive_int, default=None, help="at most this many rows per data source")
    parser.add_argument("--concurrency", type=positive_int, default=64, help="samples in flight")
    parser.add_argument(
        "--max-response-len", type=positive_int, default=2048, help="token budget of the whole multi-turn response"
    )
    parser.add_argument("--max-context-len", type=positive_int, default=None, help="prompt + response cap")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy, as Search-R1's validation")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--llm-api-mode", choices=("generate", "chat"), default=None, help="default: $LLM_API_MODE")
    parser.add_argument("--retrieval-url", default=None, help="retrieval server(s); default: $RETRIEVAL_SERVER_URL")
    parser.add_argument("--input-key", default="prompt")
    parser.add_argument("--label-key", default="reward_model")
    parser.add_argument("--tool-key", default="tools")
    parser.add_argument("--data-source-key", default="data_source")
    parser.add_argument(
        "--apply-chat-template-kwargs",
        type=json_object,
        default={},
        help="extra chat-template arguments as JSON, as slime's flag (e.g. '{\"enable_thinking\": false}')",
    )
    parser.add_argument("--max-errors", type=int, default=20, help="stop after this many samples raise")
    parser.add_argument(
        "--reference",
        choices=sorted(REFERENCES),
        default=None,
        help="print and write the paper's EM for each data source beside this run's (Search-R1, Qwen2.5-3B; "
        "third-party transcriptions of its Tables 2 and 3)",
    )
    parser.add_argument(
        "--viewer",
        action="store_true",
        help="record each trajectory's prompt, token ids, loss mask and log probs in trajectories.jsonl and write "
        "viewer/index.html, an offline page of the run (python -m slime_search_r1.viewer)",
    )
    parser.add_argument(
        "--viewer-samples",
        type=positive_int,
        default=200,
        help="trajectories per data source on the viewer page (its figures count all)",
    )
    parser.add_argument("--overwrite", action="store_true", help="discard an earlier run in --output-dir")
    args = parser.parse_args(argv)

    split = urlsplit(args.sglang_url)
    if split.scheme != "http" or not split.hostname:
        parser.error(f"--sglang-url must look like http://host:port, got {args.sglang_url!r}")
    if not 0.0 < args.top_p <= 1.0:
        parser.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    args.data_sources = [s.strip() for s in args.data_sources.split(",") if s.strip()] if args.data_sources else None
    return args


def parse_compare_args(argv: list[str]) -> Namespace:
    parser = argparse.ArgumentParser(
        prog="evaluate.py compare",
        description="EM per data source across several evaluate.py output folders (one per checkpoint): "
        f"{COMPARISON_MD} (a table) and {COMPARISON_PNG} (a line chart, one line per source).",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="evaluate.py --output-dir folders, in checkpoint order")
    parser.add_argument("--output", required=True, type=Path, help="folder for the table and the chart")
    parser.add_argument("--labels", default=None, help="comma-separated names of the runs (default: folder names)")
    args = parser.parse_args(argv)
    if args.labels is None:
        args.labels = [run.resolve().name for run in args.runs]
        if len(set(args.labels)) < len(args.labels):
            parser.error(f"the folders' names repeat ({', '.join(args.labels)}); name the runs with --labels")
    else:
        args.labels = [label.strip() for label in args.labels.split(",")]
        if len(args.labels) != len(args.runs) or not all(args.labels):
            parser.error(f"--labels needs {len(args.runs)} non-empty comma-separated names, got {len(args.labels)}")
    return args


def compare_main(argv: list[str]) -> int:
    cli = parse_compare_args(argv)
    try:
        runs = [load_results(run) for run in cli.runs]
    except ComparisonError as exc:
        print(f"evaluate.py compare: error: {exc}", file=sys.stderr)
        return 2
    try:
        write_comparison(cli.output, cli.labels, runs)
    except ImportError as exc:
        print(
            f"evaluate.py compare: wrote {cli.output / COMPARISON_MD}; no chart: {exc} (pip install matplotlib)",
            file=sys.stderr,
        )
        return 0
    print(f"evaluate.py compare: {cli.output / COMPARISON_MD} and {cli.output / COMPARISON_PNG}", file=sys.stderr)
    return 0


def apply_cli_overrides(cli: Namespace, search_configs: dict) -> None:
    """--retrieval-url and --llm-api-mode take precedence over the environment (validated by resolve_config)."""
    if cli.retrieval_url:
        search_configs.setdefault("local", {})["search_url"] = cli.retrieval_url
    if cli.llm_api_mode:
        search_configs["llm_api_mode"] = cli.llm_api_mode


def slime_args(cli: Namespace) -> Namespace:
    """The slime arguments generate() and GenerateState read, as slime would set them for this evaluation."""
    split = urlsplit(cli.sglang_url)
    host = split.netloc.rsplit(":", 1)[0] if split.port else split.netloc
    return Namespace(
        hf_checkpoint=cli.hf_checkpoint,
        sglang_router_ip=host,
        sglang_router_port=split.port or 80,
        sglang_server_concurrency=cli.concurrency,
        rollout_num_engines=1,
        sglang_dp_size=None,
        sglang_enable_deterministic_inference=False,
        rollout_seed=42,
        rollout_temperature=cli.temperature,
        rollout_top_p=1.0,  # top-p replay is a training feature; the eval top_p goes in the sampling params
        rollout_top_k=cli.top_k,
        rollout_max_response_len=cli.max_response_len,
        rollout_max_context_len=None,
        eval_max_context_len=cli.max_context_len,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        apply_chat_template_kwargs=cli.apply_chat_template_kwargs,
        n_samples_per_prompt=1,
        partial_rollout=False,
        use_tis=False,
        use_distributed_post=False,
        router_policy=None,
        reward_key=None,
        eval_reward_key="em",  # reward_func then returns its details (em, format_valid, retrieval_hit)
    )


def eval_sampling_params(cli: Namespace) -> dict:
    """slime's evaluation sampling params: ONE dict shared by every sample (the plugin must not mutate it)."""
    return dict(
        temperature=cli.temperature,
        top_p=cli.top_p,
        top_k=cli.top_k,
        max_new_tokens=cli.max_response_len,
        stop=None,
        stop_token_ids=None,
        skip_special_tokens=False,
        no_stop_trim=True,
        spaces_between_special_tokens=False,
    )


def _get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def preflight(cli: Namespace, config) -> None:
    """Fail in seconds, not after 60 retries per sample, when a server is not there."""
    health = cli.sglang_url.rstrip("/") + "/health"
    try:
        status = _get(health)
    except OSError as exc:
        raise PreflightError(
            f"SGLang does not answer at {cli.sglang_url} ({exc}); start it, e.g. "
            f"python -m sglang.launch_server --model-path {cli.hf_checkpoint} --port {urlsplit(cli.sglang_url).port}"
        ) from None
    if status != 200:
        raise PreflightError(f"SGLang answered {health} with HTTP {status}; is it still loading?")
    if config.search_backend != "local":
        return
    for url in config.local.search_url:
        split = urlsplit(url)
        base = f"{split.scheme}://{split.netloc}"
        try:
            status = _get(base + "/health")
        except OSError as exc:
            raise PreflightError(
                f"the retrieval server does not answer at {url} ({exc}); start it or set RETRIEVAL_SERVER_URL "
                "(or --retrieval-url)"
            ) from None
        if status == 503:
            raise PreflightError(f"the retrieval server at {base} is still loading (HTTP 503 on /health)")
        if status == 404:
            logger.warning("%s has no /health endpoint; assuming it is ready", base)
        elif status != 200:
            raise PreflightError(f"the retrieval server answered {base}/health with HTTP {status}")


def trajectory_record(eval_row: EvalRow, sample, reward, seconds: float, with_tokens: bool = False) -> dict:
    details = reward if isinstance(reward, dict) else {"score": reward, "em": reward}
    episode = episode_record(sample) or {}
    search = tool_counters(episode).get("search", {})
    row = eval_row.row
    status = sample.status.value if hasattr(sample.status, "value") else str(sample.status)
    return {
        "key": eval_row.key,
        "index": eval_row.index,
        "id": row.get("id"),
        "data_source": eval_row.data_source,
        "question": row.get("question"),
        "golden_answers": row.get("golden_answers"),
        "em": float(details["em"]),
        "score": float(details["score"]),
        "format_valid": details.get("format_valid"),
        "retrieval_hit": details.get("retrieval_hit"),
        "status": status,
        "finish_reason": episode.get("finish_reason"),
        "turns": episode.get("turns", 0),
        "searches": search.get("calls", 0),
        "search_failures": search.get("failures", 0),
        "tools": tool_counters(episode),
        "tool_error": episode.get("tool_error"),
        "response_length": sample.response_length,
        "seconds": round(seconds, 3),
        "response": sample.response,
        **(viewer_fields(sample, episode) if with_tokens else {}),
    }


def viewer_fields(sample, episode: dict) -> dict:
    """What the viewer shows token by token (--viewer): the prompt, the plugin's whole record, and the ids, loss mask
    and log probs of the trajectory, split at the prompt."""
    prompt_length = len(sample.tokens) - sample.response_length
    return {
        "prompt": sample.prompt,
        "episode": episode,
        "tokens": {
            "prompt_ids": list(sample.tokens[:prompt_length]),
            "response_ids": list(sample.tokens[prompt_length:]),
            "loss_mask": list(sample.loss_mask or []),
            "rollout_log_probs": list(sample.rollout_log_probs) if sample.rollout_log_probs is not None else None,
        },
    }


class Evaluation:
    def __init__(self, cli: Namespace, plugin, sample_cls, config, store: TrajectoryStore, columns: ColumnNames):
        from slime.rollout.sglang_rollout import GenerateState
        from slime.utils.http_utils import init_http_client

        self.cli = cli
        self.plugin = plugin
        self.sample_cls = sample_cls
        self.args = slime_args(cli)
        init_http_client(self.args)  # slime's post() (SEARCH_R1_ENGINE_TRANSPORT=slime) has no client before this
        # slime's process-wide state: the tokenizer generate() uses is the one that renders the prompts
        self.tokenizer = GenerateState(self.args).tokenizer
        self.columns = columns
        self.apply_chat_template = config.llm_api_mode == "generate"  # chat mode keeps the message list
        self.sampling_params = eval_sampling_params(cli)
        self.store = store
        self.errors: list[str] = []
        self.em_sum = 0.0
        self.done = 0

    async def evaluate_one(self, eval_row: EvalRow) -> dict:
        sample = build_sample(
            self.sample_cls,
            eval_row,
            self.columns,
            self.tokenizer,
            self.apply_chat_template,
            self.cli.apply_chat_template_kwargs,
        )
        started = time.perf_counter()
        sample = await self.plugin.generate(self.args, sample, self.sampling_params, evaluation=True)
        reward = await self.plugin.reward_func(self.args, sample)
        return trajectory_record(eval_row, sample, reward, time.perf_counter() - started, self.cli.viewer)

    async def run(self, todo: list[EvalRow]) -> None:
        from tqdm import tqdm

        queue: asyncio.Queue[EvalRow] = asyncio.Queue()
        for eval_row in todo:
            queue.put_nowait(eval_row)
        progress = tqdm(total=len(todo), desc="evaluate", unit="sample", dynamic_ncols=True)
        stop = asyncio.Event()

        async def worker() -> None:
            while not stop.is_set():
                try:
                    eval_row = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    record = await self.evaluate_one(eval_row)
                except ConfigError:
                    stop.set()
                    raise
                except Exception as exc:
                    self.errors.append(f"row {eval_row.index}: {type(exc).__name__}: {exc}")
                    if len(self.errors) <= 3:
                        progress.write(f"row {eval_row.index} raised {type(exc).__name__}: {exc}")
                    if len(self.errors) > self.cli.max_errors:
                        stop.set()
                    continue
                self.store.append(record)
                self.done += 1
                self.em_sum += record["em"]
                progress.update(1)
                progress.set_postfix(em=f"{self.em_sum / self.done:.3f}", errors=len(self.errors), refresh=False)

        workers = [asyncio.create_task(worker()) for _ in range(min(self.cli.concurrency, len(todo)))]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            progress.close()
            await close_loop_sessions()  # the plugin's pooled sessions are bound to this event loop


def run_config(cli: Namespace, config) -> dict:
    """What must match for a resumed run to be one evaluation (the server address may change)."""
    return {
        "data": str(cli.data.resolve()),
        "hf_checkpoint": cli.hf_checkpoint,
        "llm_api_mode": config.llm_api_mode,
        "temperature": cli.temperature,
        "top_p": cli.top_p,
        "top_k": cli.top_k,
        "max_response_len": cli.max_response_len,
        "max_context_len": cli.max_context_len,
        "max_turns": config.max_turns,
        "topk": config.topk,
        "search_backend": config.search_backend,
        "input_key": cli.input_key,
        "label_key": cli.label_key,
    }


def load_plugin():
    try:
        importlib.import_module("slime.utils.types")
    except ImportError as exc:
        print(
            f"evaluate.py: error: slime is not importable ({exc}); run it in slime's environment "
            "(pip install -e /root/slime)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None  # 2 = bad environment or input, as for unreachable servers
    plugin = importlib.import_module("generate_with_search")
    from slime.utils.types import Sample

    return plugin, Sample


def write_viewer(cli: Namespace, tokenizer) -> None:
    """viewer/index.html of this run; a page that cannot be written is a warning, the evaluation stands."""
    from slime_search_r1.viewer import InputError, TokenizerError, build_page

    model = Path(str(cli.hf_checkpoint)).name or str(cli.hf_checkpoint)
    try:
        built = build_page(
            [cli.output_dir],
            cli.output_dir / "viewer",
            tokenizer=tokenizer,
            tokenizer_path=None if tokenizer is not None else Path(cli.hf_checkpoint),
            title=f"evaluate.py: {model}",
            per_source=cli.viewer_samples,
        )
    except (InputError, TokenizerError) as exc:
        print(f"evaluate.py: warning: no viewer page: {exc}", file=sys.stderr)
        return
    print(f"evaluate.py: viewer page {built.path} ({built.size / 1e6:.1f} MB; open it in a browser)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    cli = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def fail(message: str) -> int:
        print(f"evaluate.py: error: {message}", file=sys.stderr)
        return 2

    try:
        rows = read_rows(cli.data)
        columns = ColumnNames(cli.input_key, cli.label_key, cli.tool_key, data_source_key=cli.data_source_key)
        selected = select_rows(rows, columns, cli.data_sources, cli.limit)
    except DatasetError as exc:
        return fail(str(exc))
    del rows

    plugin, sample_cls = load_plugin()
    try:
        apply_cli_overrides(cli, plugin.SEARCH_R1_CONFIGS)
        config = resolve_config(plugin.SEARCH_R1_CONFIGS)
    except ConfigError as exc:
        return fail(str(exc))

    cli.output_dir.mkdir(parents=True, exist_ok=True)
    store = TrajectoryStore(cli.output_dir)
    settings = run_config(cli, config)
    if cli.overwrite:
        for name in (store.path, cli.output_dir / "run_config.json"):
            name.unlink(missing_ok=True)
    try:
        check_run_config(cli.output_dir, settings)
    except ResumeMismatch as exc:
        return fail(str(exc))

    finished = {k: r for k, r in store.load().items() if r.get("status") not in RETRIED_STATUSES}
    todo = [row for row in selected if row.key not in finished]
    print(
        f"evaluate.py: {len(selected)} rows selected, {len(selected) - len(todo)} already in "
        f"{store.path}, {len(todo)} to run",
        file=sys.stderr,
    )

    interrupted = False
    evaluation = None
    if todo:
        try:
            preflight(cli, config)
        except PreflightError as exc:
            return fail(str(exc))
        evaluation = Evaluation(cli, plugin, sample_cls, config, store, columns)
        store.open()
        try:
            asyncio.run(evaluation.run(todo))
        except KeyboardInterrupt:
            interrupted = True
        except ConfigError as exc:
            return fail(str(exc))
        finally:
            store.close()

    selected_keys = {row.key for row in selected}
    records = [r for k, r in store.load().items() if k in selected_keys]
    summary = summarize(records, dict(Counter(row.data_source for row in selected)))
    reference = beside_paper(summary, REFERENCES[cli.reference]) if cli.reference else None
    write_reports(cli.output_dir, summary, settings, reference)
    print(json.dumps({s: v["em"] for s, v in summary["data_sources"].items()} | {"average": summary["average_em"]}))
    if reference is not None:
        print(beside_paper_markdown(reference))
    try:
        chart = f", {write_em_chart(cli.output_dir, summary, settings).name}"
    except ImportError as exc:  # the results are written; only the picture is missing
        chart = ""
        print(f"evaluate.py: warning: no chart ({exc}); pip install matplotlib", file=sys.stderr)
    print(f"evaluate.py: results in {cli.output_dir}/results.md, results.json{chart}", file=sys.stderr)
    if cli.viewer:
        write_viewer(cli, evaluation.tokenizer if evaluation is not None else None)

    if interrupted:
        print("evaluate.py: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    if evaluation is not None and evaluation.errors:
        print(
            f"evaluate.py: {len(evaluation.errors)} samples raised and were not written (first: "
            f"{evaluation.errors[0]}); rerun the same command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
