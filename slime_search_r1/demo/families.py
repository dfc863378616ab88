"""The rollout demo's family section: a few scripted episodes on each model family the plugin knows.

For each checkpoint of tests/support/model_tokenizers.py (its real tokenizer and official chat template, rebuilt
offline), the scripted stand-in (slime_search_r1/standin) serves that tokenizer in this process, its family detected
from the template as `python -m slime_search_r1.standin` detects it, so that it writes the family's calls and
thoughts. The first questions of the data the main section wrote go through the plugin's generate() and
reward_func() in both protocols, searching the same retriever, with the chat-template kwargs of the checkpoint's
MODEL preset (slime_search_r1/launch/presets.py: thinking as a launch sets it). One line per checkpoint and mode:
the family, the episodes, their searches, EM and reward, and the start of the first call a model turn wrote.
"""

import asyncio
import importlib.util
import os
import sys
from argparse import Namespace
from pathlib import Path

from local_dense_retriever.serving.launcher import free_port
from slime_search_r1.launch.presets import MODEL_PRESETS
from slime_search_r1.standin import use_slime_stub

GENERATE_FUNCTION_PATH = "generate_with_search.generate"  # run_qwen2.5_3B.sh's --custom-generate-function-path
QUESTIONS = 2  # the first rows of each mode's data
CALL_STARTS = ("<search>", "<tool_call>", "<|python_tag|>", '{"name"')  # XML tags, then the families' calls
EXCERPT = 64  # characters of the first call shown


def run_families(data: dict[str, Path], modes: dict[str, str], retrieval_url: str, env: dict[str, str]) -> list[str]:
    """Each checkpoint's episodes in each mode (`data`: folder -> parquet, `modes`: folder -> LLM_API_MODE), one
    printed line each; returns what went wrong (an episode not completed, or a mode without a search)."""
    from support.model_tokenizers import CHECKPOINTS, checkpoint_dir

    os.environ.update(env)  # the plugin's settings as the evaluations read them (the local retriever)
    plugin, sample_cls = load_plugin()
    plugin.SEARCH_R1_CONFIGS["search_backend"] = "local"
    plugin.SEARCH_R1_CONFIGS.setdefault("local", {})["search_url"] = f"{retrieval_url}/retrieve"  # the other keys kept
    print(f"\n==== each model family, scripted: the stand-in writes each family's formats on its real tokenizer "
          f"and template ({QUESTIONS} questions a mode; the searches and rewards are real)")  # fmt: skip
    print(f"{'checkpoint':<24} {'family':<15} {'mode':<9} {'episodes':<14} {'searches':>8} {'EM':>5} {'reward':>6}"
          "  first call")  # fmt: skip
    problems = []
    for checkpoint in CHECKPOINTS:
        problems += run_checkpoint(plugin, sample_cls, checkpoint, checkpoint_dir(checkpoint), data, modes)
    return problems


def load_plugin():
    """The plugin module, loaded as slime loads --custom-generate-function-path (slime's load_function), and slime's
    Sample: slime's, else its stand-in in this checkout (tests/slime_stub, as evaluate.py uses it)."""
    repo = Path(__file__).resolve().parents[2]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    if importlib.util.find_spec("slime") is None:
        use_slime_stub()
    from slime.utils.misc import load_function
    from slime.utils.types import Sample

    generate = load_function(GENERATE_FUNCTION_PATH)
    return sys.modules[generate.__module__], Sample


def run_checkpoint(plugin, sample_cls, checkpoint: str, tokenizer_dir: Path, data, modes) -> list[str]:
    """Both modes on one checkpoint: its stand-in serves the tokenizer slime's GenerateState loads (once)."""
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.http_utils import init_http_client

    from slime_search_r1.evaluation.runner import slime_args
    from slime_search_r1.families.detection import tokenizer_family
    from slime_search_r1.standin.policy import StandInPolicy, registered_tools
    from slime_search_r1.standin.server import StandInEngine, serving

    port = free_port()
    cli = Namespace(hf_checkpoint=str(tokenizer_dir), sglang_url=f"http://127.0.0.1:{port}", concurrency=QUESTIONS,
                    temperature=1.0, top_p=1.0, top_k=-1, max_response_len=1024, max_context_len=None,
                    apply_chat_template_kwargs=MODEL_PRESETS[checkpoint].chat_template_kwargs,
                    viewer=False)  # fmt: skip
    args = slime_args(cli)
    GenerateState.clear_instances()  # a process-wide singleton: this checkpoint's tokenizer from here on
    tokenizer = GenerateState(args).tokenizer
    init_http_client(args)
    family = tokenizer_family("auto", tokenizer)
    engine = StandInEngine(tokenizer, StandInPolicy(registered_tools(), family), tokenizer_path=str(tokenizer_dir))
    problems = []
    with serving(engine.app, "127.0.0.1", port):
        for folder, mode in modes.items():
            plugin.SEARCH_R1_CONFIGS["llm_api_mode"] = mode
            records = asyncio.run(episodes(plugin, sample_cls, cli, args, tokenizer, data[folder], mode))
            problems += report(checkpoint, family.name, mode, records)
    return problems


async def episodes(plugin, sample_cls, cli: Namespace, args: Namespace, tokenizer, data: Path, mode: str) -> list:
    """The first QUESTIONS rows through generate() and reward_func(), side by side, as evaluate.py runs each one."""
    from slime_search_r1.evaluation.dataset import ColumnNames, EvalRow, build_sample, read_rows
    from slime_search_r1.evaluation.runner import eval_sampling_params, trajectory_record
    from slime_search_r1.http_client import close_loop_sessions
    from slime_search_r1.loop import enabled_tools

    tools = enabled_tools(plugin.current_config())
    params = eval_sampling_params(cli)

    async def one(index: int, row: dict) -> dict:
        eval_row = EvalRow(index, row.get("data_source", ""), row)
        sample = build_sample(sample_cls, eval_row, ColumnNames(), tokenizer, mode == "generate",
                              cli.apply_chat_template_kwargs)  # fmt: skip
        sample = await plugin.generate(args, sample, params, evaluation=True)
        reward = await plugin.reward_func(args, sample)
        return trajectory_record(eval_row, sample, reward, 0.0, tools=tools)

    try:
        return await asyncio.gather(*(one(i, row) for i, row in enumerate(read_rows(data)[:QUESTIONS])))
    finally:
        await close_loop_sessions()


def report(checkpoint: str, family: str, mode: str, records: list[dict]) -> list[str]:
    """One checkpoint × mode line; what went wrong, if anything."""
    completed = sum(record["status"] == "completed" for record in records)
    searches = sum(record["searches"] for record in records)
    em = sum(record["em"] for record in records) / len(records)
    reward = sum(record["score"] for record in records) / len(records)
    excerpt = next((call_excerpt(record["response"]) for record in records if call_excerpt(record["response"])), "")
    print(f"{checkpoint:<24} {family:<15} {mode:<9} {f'{completed}/{len(records)} completed':<14} {searches:>8} "
          f"{em:>5.2f} {reward:>6.2f}  {excerpt}", flush=True)  # fmt: skip
    problems = [f"{checkpoint} {mode}: {len(records) - completed} episodes not completed"]
    problems = problems if completed < len(records) else []
    return problems + ([f"{checkpoint} {mode}: no search"] if not searches else [])


def call_excerpt(response: str) -> str:
    """The start of the first call in a model turn (its newlines shown as \\n), or ''."""
    starts = [at for at in (response.find(start) for start in CALL_STARTS) if at >= 0]
    if not starts:
        return ""
    text = response[min(starts) :].replace("\n", "\\n")
    return text if len(text) <= EXCERPT else text[: EXCERPT - 3] + "..."
