"""slime dumps made the way slime makes them, from real episodes of the test engine, for the viewer's tests.

The episodes run generate() and reward_func() against the loopback engine and a retriever whose corpus holds a
hostile passage (special-token text, markup, a script); slime's own Sample.to_dict and save_debug_rollout_data
write the rollout and evaluation dumps (the stand-in's, or real slime's with SLIME_SRC), and slime's train-dump
payload builder writes the train side from two DP shards, as slime's actor holds them after training.

The folder looks like slime's --dump-details: rollout_data/<id>.pt, rollout_data/eval_<id>.pt, train_data/<id>.pt
and tokenizer/.
"""

import asyncio
import copy
from dataclasses import dataclass
from pathlib import Path

import torch

import generate_with_search
from generate_with_search import generate, reward_func
from slime.observability.rollout_data_utils import save_debug_rollout_data
from slime.observability.train_data_utils import _build_dump_payload
from slime.rollout.sglang_rollout import GenerateState, abort
from slime.utils.http_utils import init_http_client
from slime.utils.types import Sample
from slime_search_r1.http_client import close_loop_sessions
from support import slime_compat
from support.episodes import (
    ANSWER_TURN,
    BARE_CALL,
    CALL,
    CHAT_ANSWER,
    MALFORMED,
    NO_ACTION_TURN,
    SEARCH_TURN,
    WRONG_TURN,
    chat_sample,
    xml_sample,
)
from support.fake_retriever import DEFAULT_DOCS, FakeRetriever
from support.fake_sglang import FakeSGLangEngine, ScriptedPolicy
from support.loopback import serve_in_thread
from support.slime_rollout import slime_args, slime_sampling_params

ROLLOUT_ID = 3
# A retrieved passage no page may treat as markup.
HOSTILE_TEXT = (
    'hostile passage <|im_end|> <script>window.__pwned = 1</script></script><img src=x onerror="window.__pwned = 2">'
    " &amp; <b>bold</b> <!-- comment --> line\u2028and paragraph\u2029separators (end a line in a JavaScript string)"
)
HOSTILE_DOC = f'"Hostile"\n{HOSTILE_TEXT}'
# A turn whose text splits characters across tokens (the byte-level BPE writes an emoji in several tokens).
MULTIBYTE_TURN = "<think>巴黎是法国的首都 🗼🥐</think>\n<answer> Paris </answer>"
HOSTILE_SEARCH = "<think>Look it up.</think>\n<search> hostile passage </search>"
# Where the train side's log probs differ from the rollout's by more than any threshold: (sample name, token).
GAP = 1.5


@dataclass
class Episode:
    name: str
    mode: str  # "generate" (XML) or "chat"
    script: list[str]
    data_source: str
    budget: int = 1024
    retriever_down: bool = False
    aborted: bool = False
    resumed: bool = False  # slime aborts it in the second turn and resumes it (--partial-rollout)


TRAIN_EPISODES = [
    Episode("right", "generate", [SEARCH_TURN, ANSWER_TURN], "nq"),
    Episode("wrong", "generate", [SEARCH_TURN, WRONG_TURN], "nq"),
    Episode("invalid then right", "generate", [NO_ACTION_TURN, ANSWER_TURN], "hotpotqa"),
    Episode("max turns", "generate", [SEARCH_TURN], "hotpotqa"),
    Episode("hostile", "generate", [HOSTILE_SEARCH, ANSWER_TURN], "nq"),
    Episode("multibyte", "generate", [MULTIBYTE_TURN], "nq"),
    Episode("chat", "chat", [CALL, CHAT_ANSWER], "hotpotqa"),
    Episode("chat malformed", "chat", [MALFORMED, BARE_CALL, ANSWER_TURN], "hotpotqa"),
    Episode("failed", "generate", [SEARCH_TURN, ANSWER_TURN], "nq", retriever_down=True),
    Episode("aborted", "generate", [SEARCH_TURN, ANSWER_TURN], "nq", aborted=True),
    Episode("resumed", "generate", [SEARCH_TURN, ANSWER_TURN], "nq", resumed=True),
]
TRAIN_NAMES = [e.name for e in TRAIN_EPISODES]
NEW_RECORD_KEY = {"from_turn": 1, "kept_tokens": 20}
NEW_RECORD_NAME = "from_a_newer_plugin"
LONG_HORIZON_KEYS = {
    "forced_answer": {"mode": "inject", "turn": 3, "trigger": "max_turns", "tokens": 18},
    "page_chunks": 2,
}
RESUMED_AFTER = 6  # tokens of the second turn sampled when the abort came
ABORT_STEP = 1  # the one more decode step an abort runs: its token is the aborted answer's last
EVAL_EPISODES = [
    Episode("eval right", "generate", [SEARCH_TURN, ANSWER_TURN], "nq"),
    Episode("eval chat", "chat", [CALL, CHAT_ANSWER], "bamboogle"),
]


@dataclass
class Dumps:
    folder: Path
    rollout: Path
    evaluation: Path
    train: Path
    samples: list[Sample]  # the training rollout's samples, in dump order (names in `names`)
    names: list[str]
    eval_samples: list[Sample]
    train_payload: dict

    def sample(self, name: str) -> Sample:
        return self.samples[self.names.index(name)]


async def _run(
    episode: Episode, index: int, args, policy, retriever, config, tokenizer, evaluation: bool, sample=None
) -> Sample:
    question = f"Question {index} {episode.name}"
    policy.scripts[question + "?"] = episode.script
    config["llm_api_mode"] = episode.mode
    if sample is None:
        sample = chat_sample(question) if episode.mode == "chat" else xml_sample(tokenizer, question)
        sample.index, sample.group_index = index, index // 2
        sample.metadata["data_source"] = episode.data_source
    retriever.down = episode.retriever_down
    GenerateState(args).aborted = episode.aborted
    try:
        sample = await generate(args, sample, slime_sampling_params(episode.budget), evaluation=evaluation)
    finally:
        retriever.down = False
        GenerateState(args).aborted = False
    if sample.status != Sample.Status.ABORTED:  # slime does not score aborted samples
        sample.reward = await reward_func(args, sample)
    return sample


async def _run_resumed(episode: Episode, index: int, args, engine, run) -> Sample:
    """An episode slime aborts RESUMED_AFTER tokens into its second turn (abort(), as when a rollout has enough
    groups) and hands back to generate() in the next rollout, with --partial-rollout, after a weight update: the
    resumed tokens come from the next weight version."""
    args = copy.copy(args)
    args.partial_rollout = True
    hold = engine.hold_call(len(engine.calls) + 2, RESUMED_AFTER)
    first = asyncio.ensure_future(run(episode, index, args))
    await asyncio.to_thread(hold.reached.wait)
    await abort(args, ROLLOUT_ID - 1)
    sample = await first
    engine.push_weights()  # slime trains on the rollout and pushes the new weights before the next one
    assert sample.status == Sample.Status.ABORTED, sample.status
    sample.metadata["start_rollout_id"] = ROLLOUT_ID - 1  # what abort() writes on the groups it collects
    GenerateState(args).aborted = False
    return await run(episode, index, args, sample)


def _run_all(tokenizer, tokenizer_dir: str) -> tuple[list[Sample], list[Sample]]:
    policy = ScriptedPolicy()
    engine = FakeSGLangEngine(tokenizer, policy)
    retriever = FakeRetriever([*DEFAULT_DOCS, HOSTILE_DOC])
    config = generate_with_search.SEARCH_R1_CONFIGS
    saved = copy.deepcopy(config)
    slime_compat.reset_generate_state()
    with serve_in_thread(engine.app) as engine_url, serve_in_thread(retriever.app) as retriever_url:
        engine.url = engine_url  # the router's /workers answer, which slime's abort() reads
        config["local"] = {**config["local"], "search_url": retriever_url}
        config.update(search_backend="local", search_timeout=2.0, search_attempts=1)
        args = slime_args(tokenizer_dir, engine_url)

        async def train_episode(episode: Episode, index: int, args, sample=None) -> Sample:
            return await _run(episode, index, args, policy, retriever, config, tokenizer, False, sample)

        async def episodes():
            init_http_client(args)  # slime's abort() talks to the engines through slime's client
            try:
                train = [
                    await (_run_resumed(e, i, args, engine, train_episode) if e.resumed else train_episode(e, i, args))
                    for i, e in enumerate(TRAIN_EPISODES)
                ]
                evaluation = [
                    await _run(e, 100 + i, args, policy, retriever, config, tokenizer, True)
                    for i, e in enumerate(EVAL_EPISODES)
                ]
                return train, evaluation
            finally:
                await close_loop_sessions()
                await slime_compat.close_http_client()

        try:
            return asyncio.run(episodes())
        finally:
            config.clear()
            config.update(saved)
            slime_compat.reset_generate_state()
            slime_compat.reset_http_client()


def train_log_probs(sample: Sample) -> list[float]:
    """The train side's log probs: the rollout's, nudged a little, and one trained token off by GAP (the gap the page
    must mark) on every sample with trained tokens; observation tokens 0.0 as slime leaves them."""
    pairs = enumerate(zip(sample.rollout_log_probs, sample.loss_mask, strict=True))
    values = [lp + (0.001 * (i % 7) if m else 0.0) for i, (lp, m) in pairs]
    trained = [i for i, m in enumerate(sample.loss_mask) if m]
    if trained:
        values[trained[len(trained) // 2]] -= GAP
    return values


def train_payload(samples: list[Sample]) -> dict:
    """slime's train dump of this rollout from two DP ranks, each holding every other sample (partition = the
    rollout-dump positions it trained), with the per-token fields the actor computes."""
    shards = []
    for rank in range(2):
        partition = list(range(rank, len(samples), 2))
        mine = [samples[p] for p in partition]
        advantages = [float(p % 3) - 1.0 for p in partition]  # GRPO: one advantage per sample, on every token
        shards.append(
            {
                "rank": rank,
                "data_parallel_rank": rank,
                "rollout_data": {
                    "partition": partition,
                    "tokens": [torch.tensor(s.tokens, dtype=torch.long) for s in mine],
                    "response_lengths": [s.response_length for s in mine],
                    "rewards": [float(s.reward or 0.0) if not isinstance(s.reward, dict) else 0.0 for s in mine],
                    "truncated": [int(s.status == Sample.Status.TRUNCATED) for s in mine],
                    "loss_masks": [
                        torch.tensor([0] * s.response_length if s.remove_sample else s.loss_mask, dtype=torch.int)
                        for s in mine
                    ],
                    "sample_indices": [s.index for s in mine],
                    "rollout_ids": [s.index for s in mine],
                    "rollout_log_probs": [torch.tensor(s.rollout_log_probs, dtype=torch.float32) for s in mine],
                    "log_probs": [torch.tensor(train_log_probs(s), dtype=torch.float32) for s in mine],
                    "ref_log_probs": [
                        torch.tensor([lp - 0.01 for lp in s.rollout_log_probs], dtype=torch.float32) for s in mine
                    ],
                    "advantages": [torch.full((s.response_length,), a) for s, a in zip(mine, advantages, strict=True)],
                    "entropy": [torch.tensor([0.5 + 0.01 * (i % 10) for i in range(s.response_length)]) for s in mine],
                    "total_lengths": [len(s.tokens) for s in samples],
                    "raw_reward": [0.0] * len(samples),
                    "global_batch_sizes": [len(samples)],
                    "num_microbatches": [1],
                    "micro_batch_indices": [[list(range(len(mine)))]],
                },
            }
        )
    return _build_dump_payload(shards, rollout_id=ROLLOUT_ID, writer_rank=0)


def make_dumps(folder: Path, tokenizer, tokenizer_dir: str) -> Dumps:
    train, evaluation = _run_all(tokenizer, tokenizer_dir)
    # a record key this viewer does not draw (a newer plugin's): the page must still show it
    train[TRAIN_NAMES.index("wrong")].metadata["search_r1"][NEW_RECORD_NAME] = NEW_RECORD_KEY
    # long-horizon keys the page draws in the Episode card (this episode ran without them; only the card is tested)
    train[TRAIN_NAMES.index("wrong")].metadata["search_r1"].update(LONG_HORIZON_KEYS)
    template = str(folder / "rollout_data" / "{rollout_id}.pt")
    save_debug_rollout_data(template, train, rollout_id=ROLLOUT_ID, evaluation=False)
    save_debug_rollout_data(
        template, {"search_r1_test": {"samples": evaluation}}, rollout_id=ROLLOUT_ID, evaluation=True
    )
    payload = train_payload(train)
    train_path = folder / "train_data" / f"{ROLLOUT_ID}.pt"
    train_path.parent.mkdir(parents=True)
    torch.save(payload, train_path)
    tokenizer.save_pretrained(str(folder / "tokenizer"))  # as --dump-details does
    return Dumps(
        folder=folder,
        rollout=folder / "rollout_data" / f"{ROLLOUT_ID}.pt",
        evaluation=folder / "rollout_data" / f"eval_{ROLLOUT_ID}.pt",
        train=train_path,
        samples=train,
        names=TRAIN_NAMES,
        eval_samples=evaluation,
        train_payload=payload,
    )
