"""A constructed run for docs/watching.md's "Seeing a collapse coming": the test engine's scripted policy drifts into
repetition over successive rollouts, and every rollout goes through slime's rollout path (generate_and_rm_group ->
generate() -> reward_func) and slime's rollout logging (log_rollout_data -> log_rollout_metrics).

Two GRPO groups of four samples per rollout, one question each. In each group, rollout by rollout, the policy writes:

  rollouts 0-3  three right answers after a search, one wrong one                 (healthy)
  rollout 4     one of the right answers thinks in a loop first, and still answers right
  rollout 5     two of them loop, and still answer right
  rollout 6     one loops without end and never answers, two loop and answer right
  rollout 7     two loop without end, one loops and answers right

The engine's log probs are a model of their own, constructed: a token whose four predecessors and itself already
occurred in the context costs 0.05 nats (a copy is easy), any other 0.9. Nothing here is a trained model; it shows
what the signals and the warnings do with a run that drifts this way.
"""

import asyncio
import logging
from dataclasses import dataclass, field

from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.training import metrics as hook_metrics
from slime_search_r1.standin.model import ASSISTANT_MARKER
from slime_search_r1.training.collapse import CollapseWatch
from support.episodes import label
from support.fake_sglang import question_of, turn_index
from support.slime_rollout import chat_prompt, log_rollout_data
from support.tracking import record_tracking

QUESTIONS = ("What is the capital of France", "Which city is the capital of France")
LOOP = "I need to look this up. "
VARIANTS = {  # what the policy writes on each turn; a later turn is found by the first turn in the context
    "loop_forever": ["<think>" + LOOP * 40],
    "loop": [
        "<think>" + LOOP * 12 + "</think>\n<search> capital of France </search>",
        "<think>The documents say Paris.</think>\n<answer> Paris </answer>",
    ],
    "right": [
        "<think>I need to look this up.</think>\n<search> capital of France </search>",
        "<think>The documents say Paris.</think>\n<answer> Paris </answer>",
    ],
    "wrong": [
        "<think>Let me search for it.</think>\n<search> France capital </search>",
        "<think>The documents say Berlin.</think>\n<answer> Berlin </answer>",
    ],
}
PLANS = [  # each group's four samples, rollout by rollout
    *[("right", "right", "right", "wrong")] * 4,
    ("loop", "right", "right", "wrong"),
    ("loop", "loop", "right", "wrong"),
    ("loop_forever", "loop", "loop", "wrong"),
    ("loop_forever", "loop_forever", "loop", "wrong"),
]
COLUMNS = (  # README column -> logged metric
    ("reward", "reward"),
    ("em", "em"),
    ("repetition", "health/repetition_share"),
    ("reasoning chars", "health/reasoning_chars"),
    ("neg log prob", "health/neg_log_prob"),
    ("top-reward log prob", "health/top_reward_log_prob"),
    ("no answer", "health/no_answer_share"),
)


class DriftingPolicy:
    """The scripted model: the first turn of each sample takes the next variant of its group's plan."""

    def __init__(self):
        self.plan: tuple[str, ...] = PLANS[0]
        self.started: dict[str, int] = {}

    def next_rollout(self, plan: tuple[str, ...]) -> None:
        self.plan, self.started = plan, {}

    def __call__(self, context_text: str) -> str:
        index = turn_index(context_text)
        if index == 0:
            question = question_of(context_text)
            taken = self.started.get(question, 0)
            self.started[question] = taken + 1
            return VARIANTS[self.plan[taken % len(self.plan)]][0]
        reply = context_text.rpartition(ASSISTANT_MARKER)[2]
        variant = next(turns for turns in VARIANTS.values() if reply.lstrip().startswith(turns[0]))
        return variant[min(index, len(variant) - 1)]


def copying_is_easy(context: list[int], sampled: list[int]) -> list[float]:
    """The constructed model's log probs: 0.05 nats for a 5-gram the context already holds, 0.9 for any other."""
    ids = [*context, *sampled]
    seen = {tuple(ids[i - 4 : i + 1]) for i in range(4, len(context))}
    log_probs = []
    for position in range(len(context), len(ids)):
        gram = tuple(ids[position - 4 : position + 1])
        log_probs.append(-0.05 if gram in seen else -0.9)
        seen.add(gram)
    return log_probs


@dataclass
class Rollout:
    rollout_id: int
    metrics: dict[str, float]  # what the log hook sent to slime's tracking call, without the prefix
    warnings: list[str] = field(default_factory=list)  # the warning lines of the training log
    samples: list[Sample] = field(default_factory=list)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def constructed_run(args, tokenizer, engine) -> list[Rollout]:
    """Every rollout of PLANS through slime's path, with a fresh collapse watch; args: slime's, 4 samples per prompt,
    2 prompts, the plugin's reward and log functions."""
    policy = DriftingPolicy()
    engine.policy, engine.log_probs_of = policy, copying_is_easy
    watch, saved = CollapseWatch(), hook_metrics.COLLAPSE_WATCH
    hook_metrics.COLLAPSE_WATCH = watch
    handler = _Lines()
    logging.getLogger(hook_metrics.__name__).addHandler(handler)
    rollouts = []
    try:
        with record_tracking() as calls:
            for rollout_id, plan in enumerate(PLANS):
                policy.next_rollout(plan)
                groups = [
                    [
                        Sample(
                            prompt=chat_prompt(tokenizer, question),
                            label=label("Paris"),
                            index=4 * g + k,
                            group_index=g,
                        )
                        for k in range(args.n_samples_per_prompt)
                    ]
                    for g, question in enumerate(QUESTIONS)
                ]
                state = GenerateState(args)
                state.submit_generate_tasks(groups)
                done = await asyncio.gather(*state.pendings)
                state.reset()
                samples = [sample for group in done for sample in group]
                handler.lines = []
                log_rollout_data(rollout_id, args, samples, None, 0.0)
                logged = next(c["metrics"] for c in reversed(calls) if "rollout/search_r1/samples" in c["metrics"])
                prefix = hook_metrics.TRAIN_PREFIX
                metrics = {k.removeprefix(prefix): v for k, v in logged.items() if k.startswith(prefix)}
                warnings = [line for line in handler.lines if "collapse warning" in line]
                rollouts.append(Rollout(rollout_id, metrics, warnings, samples))
    finally:
        hook_metrics.COLLAPSE_WATCH = saved
        logging.getLogger(hook_metrics.__name__).removeHandler(handler)
    return rollouts


def warned_signals(rollout: Rollout) -> list[str]:
    """The signals a rollout's warning lines name (health/<signal>)."""
    return [line.split(": ", 1)[1].split(" = ", 1)[0] for line in rollout.warnings]


def table(rollouts: list[Rollout]) -> str:
    """The table of the run that docs/watching.md shows."""
    header = ["rollout", *(name for name, _ in COLUMNS), "warnings"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * (len(header) - 1) + "---|"]
    for rollout in rollouts:
        values = [f"{rollout.metrics[key]:.3f}" if key in rollout.metrics else "-" for _, key in COLUMNS]
        warned = ", ".join(signal.removeprefix("health/") for signal in warned_signals(rollout)) or "-"
        lines.append("| " + " | ".join([str(rollout.rollout_id), *values, warned]) + " |")
    return "\n".join(lines)
