"""One evaluation: every selected row through the plugin's generate() and reward_func(), as slime's in-training
evaluation calls them, against a running SGLang server (or router) and the configured search backend.

The plugin is passed in (evaluate.py loads generate_with_search, the user's settings and hooks): this package never
imports the top-level files. Each finished sample becomes one line of trajectories.jsonl (trajectory_record): its
status and counters, the answer it gave and its rule-based scores (EM from reward_func, F1 and cover EM from
scoring/answers.py over the same answer), and whether the scripted stand-in wrote its turns (slime_search_r1/standin:
the weight version its answers carry, which the plugin records per engine call).
"""

import asyncio
import logging
import time
import urllib.error
import urllib.request
from argparse import Namespace
from urllib.parse import urlsplit

from slime_search_r1.data import golden_answers
from slime_search_r1.registry import ANSWER_SCORES
from slime_search_r1.evaluation.dataset import ColumnNames, EvalRow, build_sample
from slime_search_r1.evaluation.store import TrajectoryStore
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.episode import episode_record, tool_counters
from slime_search_r1.scoring.answers import answer_of, rule_scores
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.standin import scripted_record
from slime_search_r1.tools.contract import Tool

logger = logging.getLogger("evaluate")


class Evaluation:
    """The run: each row through the plugin's generate() and reward_func() (`cli.concurrency` samples in flight),
    each finished sample appended to the store as its trajectories.jsonl line; a sample that raises is counted in
    `errors` and retried by the next run, and the run stops after --max-errors of them."""

    def __init__(self, cli: Namespace, plugin, sample_cls, config, store: TrajectoryStore, columns: ColumnNames):
        from slime.rollout.sglang_rollout import GenerateState
        from slime.utils.http_utils import init_http_client

        from slime_search_r1.loop import enabled_tools  # the rollout's tools, and slime with them: imported here

        self.cli = cli
        self.plugin = plugin
        self.sample_cls = sample_cls
        self.args = slime_args(cli)
        init_http_client(self.args)  # slime's post() (SEARCH_R1_ENGINE_TRANSPORT=slime) has no client before this
        # slime's process-wide state: the tokenizer generate() uses is the one that renders the prompts
        self.tokenizer = GenerateState(self.args).tokenizer
        self.columns = columns
        self.tools = enabled_tools(config)
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
        seconds = time.perf_counter() - started
        return trajectory_record(eval_row, sample, reward, seconds, self.cli.viewer, self.tools)

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


def trajectory_record(
    eval_row: EvalRow, sample, reward, seconds: float, with_tokens: bool = False, tools: dict[str, Tool] | None = None
) -> dict:
    """One trajectories.jsonl line: the row, the answer and its scores (EM from reward_func, F1 and cover EM over the
    same answer), the sample's status and tool counters, its response; with `with_tokens` (--viewer) also what the
    viewer shows token by token (viewer_fields)."""
    details = reward if isinstance(reward, dict) else {"score": reward, "em": reward}
    episode = episode_record(sample) or {}
    search = tool_counters(episode).get("search", {})
    row = eval_row.row
    status = sample.status.value if hasattr(sample.status, "value") else str(sample.status)
    golds = _golds_of(sample, row)
    answer = answer_of(sample, tools)
    scores = rule_scores(answer, golds) if golds is not None else {}
    return {
        "key": eval_row.key,
        "index": eval_row.index,
        **({"sample": eval_row.sample} if eval_row.sample is not None else {}),
        "id": row.get("id"),
        "data_source": eval_row.data_source,
        "question": row.get("question"),
        "golden_answers": golds if golds is not None else row.get("golden_answers"),
        "answer": answer,
        "em": float(details["em"]),  # the plugin's reward_func: the EM training logs
        **{name: scores.get(name) for name in ANSWER_SCORES.names() if name != "em"},  # f1, cover_em, yours
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
        "scripted": scripted_record(episode),  # the scripted stand-in answered, not a model
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


def _golds_of(sample, row: dict) -> list[str] | None:
    for label in (sample.label, row.get("golden_answers")):
        try:
            return golden_answers(label)
        except (ValueError, TypeError):
            continue
    return None


def run_config(cli: Namespace, config) -> dict:
    """What must match for a resumed run to be one evaluation (the server address and the judge may change)."""
    settings = {
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
    if cli.samples_per_question > 1:  # written only above 1: a run_config.json without it means one sample each
        settings["samples_per_question"] = cli.samples_per_question
    return settings


class PreflightError(RuntimeError):
    """A server the evaluation needs does not answer."""


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


def _get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


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
