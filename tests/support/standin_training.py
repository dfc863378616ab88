"""A stand-in for slime training, run by the wrapper's tests as TRAIN_CMD in its tmux window.

It does what slime's rollout does with the plugin, minus the GPUs: a loopback SGLang engine (FakeSGLangEngine)
whose scripted "model" searches the question and then answers with the title of the first document it was
shown; GRPO-style groups of samples through generate_with_search.generate + reward_func, with the search going
to RETRIEVAL_SERVER_URL exactly as the plugin reads it from the environment (the server the wrapper started).
Then one evaluation pass over the same questions (data source "mini_wiki"), and slime's rollout logging of both
with the plugin's log functions as run_qwen2.5_3B.sh configures them; what reached slime's tracking call (wandb
here) is in the report under "logged".

    STANDIN_QUESTIONS  JSON file: [[question, gold answer], ...]      (required)
    STANDIN_REPORT     where to write what happened, as JSON          (required)
    STANDIN_EXIT_CODE  exit code after successful rollouts (default 0)
    STANDIN_HOLD_S     keep running this long afterwards (interrupt tests); Ctrl-C exits 130

Exits 1 if any rollout did not complete, made no search or had a search fail.
"""

import asyncio
import json
import os
import re
import sys
import time
from argparse import Namespace
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
sys.path[:0] = [str(SUPPORT.parent), str(SUPPORT.parents[1])]

from support import slime_compat  # noqa: E402, F401 (puts the slime under test on sys.path: stand-in or SLIME_SRC)
from transformers import AutoTokenizer  # noqa: E402

import generate_with_search  # noqa: E402
from slime_search_r1.http_client import close_loop_sessions  # noqa: E402
from slime.utils.types import Sample  # noqa: E402
from support.episodes import search_failures, searches  # noqa: E402
from support.fake_sglang import FakeSGLangEngine, question_of  # noqa: E402
from support.loopback import serve_in_thread  # noqa: E402
from support.qwen_tokenizer import qwen25_tokenizer_dir  # noqa: E402
from support.tracking import record_tracking  # noqa: E402
from support.slime_rollout import (  # noqa: E402
    EVAL_ROLLOUT_LOG_FUNCTION,
    ROLLOUT_LOG_FUNCTION,
    chat_prompt,
    eval_data,
    log_eval_rollout_data,
    log_rollout_data,
    slime_args,
    slime_sampling_params,
)

SAMPLES_PER_PROMPT = 2
FIRST_TITLE = re.compile(r'Doc 1\(Title: "(.+?)"\)')


def read_then_answer(context_text: str) -> str:
    """Search the question on the first turn; then answer with the title of the first document shown."""
    reply = context_text.rsplit("<|im_start|>assistant", 1)[-1]
    titles = FIRST_TITLE.findall(reply)
    if not titles:
        return f"<think>I need to look this up.</think>\n<search> {question_of(context_text)} </search>"
    return f"<think>The first document is about {titles[-1]}.</think>\n<answer> {titles[-1]} </answer>"


def standin_args(tokenizer_dir: str, engine_url: str) -> Namespace:
    return slime_args(
        tokenizer_dir,
        engine_url,
        rollout_max_response_len=2048,
        n_samples_per_prompt=SAMPLES_PER_PROMPT,
        use_wandb=True,
        custom_rollout_log_function_path=ROLLOUT_LOG_FUNCTION,
        custom_eval_rollout_log_function_path=EVAL_ROLLOUT_LOG_FUNCTION,
    )


async def rollouts(args: Namespace, tokenizer, questions: list[list[str]], evaluation: bool = False) -> list[Sample]:
    """Training: SAMPLES_PER_PROMPT samples per question; evaluation: one, greedy, from data source "mini_wiki"."""
    base_params = slime_sampling_params(args.rollout_max_response_len)
    if evaluation:
        base_params["temperature"] = 0.0

    async def one(question: str, answer: str) -> Sample:
        prompt = chat_prompt(tokenizer, question)
        label = {"style": "rule", "ground_truth": {"target": [answer]}}
        metadata = {"data_source": "mini_wiki"} if evaluation else {}
        sample = Sample(prompt=prompt, label=label, metadata=metadata)
        sample = await generate_with_search.generate(args, sample, dict(base_params), evaluation=evaluation)
        sample.reward = await generate_with_search.reward_func(args, sample)  # as slime's generate_and_rm
        return sample

    try:
        copies = 1 if evaluation else SAMPLES_PER_PROMPT
        return await asyncio.gather(*(one(q, a) for q, a in questions for _ in range(copies)))
    finally:
        await close_loop_sessions()


def main() -> int:
    questions = json.loads(Path(os.environ["STANDIN_QUESTIONS"]).read_text())
    tokenizer_dir = str(qwen25_tokenizer_dir())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    engine = FakeSGLangEngine(tokenizer, read_then_answer)
    with serve_in_thread(engine.app) as engine_url, record_tracking() as logged:
        args = standin_args(tokenizer_dir, engine_url)
        started = time.monotonic()
        results = asyncio.run(rollouts(args, tokenizer, questions))
        log_rollout_data(0, args, results, None, time.monotonic() - started)
        evaluated = asyncio.run(rollouts(args, tokenizer, questions, evaluation=True))
        log_eval_rollout_data(0, args, eval_data("standin_eval", evaluated))

    report = {
        "retrieval_urls": list(
            generate_with_search.resolve_config(generate_with_search.SEARCH_R1_CONFIGS).local.search_url
        ),
        "rollouts": len(results),
        "statuses": [sample.status.value for sample in results],
        "searches": [searches(sample) for sample in results],
        "search_failures": sum(search_failures(sample) for sample in results),
        "answers": [FIRST_TITLE.findall(sample.response)[-1:] for sample in results],
        "rewards": [sample.reward for sample in results],
        "engine_calls": len(engine.calls),
        "logged": logged,
    }
    Path(os.environ["STANDIN_REPORT"]).write_text(json.dumps(report, indent=1))
    problems = []
    if any(status != "completed" for status in report["statuses"]):
        problems.append(f"not every rollout completed: {report['statuses']}")
    if any(count != 1 for count in report["searches"]) or report["search_failures"]:
        problems.append(f"searches {report['searches']}, failures {report['search_failures']}")
    if problems:
        print("stand-in training failed: " + "; ".join(problems), flush=True)
        return 1
    print(f"stand-in training: {len(results)} rollouts, mean reward {sum(report['rewards']) / len(results):.2f}")
    print("rollouts done", flush=True)
    try:
        time.sleep(float(os.environ.get("STANDIN_HOLD_S", "0")))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    return int(os.environ.get("STANDIN_EXIT_CODE", "0"))


if __name__ == "__main__":
    sys.exit(main())
