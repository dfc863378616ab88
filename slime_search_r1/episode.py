"""One episode: what its turns are made of, what it knows while it runs, and the record it leaves on its sample.

  Turn, ToolCall, Action, Reply   what passes between the loop, a token driver, a protocol and the tools
  encode_text, encode_prompt      the ids of text the model did not write: its prompt, what it is shown
  EpisodeState, EpisodeStats      what the loop owns and hands on: settings, tools, where the episode stands, counters
  the record                      sample.metadata["search_r1"]: the counters, how the episode ended, (chat) its
                                  conversation, where an aborted one stood, the policy version of each engine
                                  call's tokens; reward_func adds the reward's parts
  weight versions                 version_spans, token_versions, version_number: which policy wrote which token
                                  (how far those lag behind the newest: training/staleness.py)

generate() writes the record once, at the end (loop.py); reward_func, the log hooks, evaluate.py and the viewer read
it with the functions below. Everything stored is plain Python (dicts, lists, str, int, float, bool, None): slime
keeps samples in its data buffer and dumps them with torch.save. Nothing here imports slime: the viewer reads
records on a machine without it.
"""

import threading
from argparse import Namespace
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import lru_cache
from typing import Any

# ---- what one turn is made of -----------------------------------------------------------------------------------
# A driver returns the Turn the model generated; the protocol reads it into an Action (its tool calls, or its
# answer); the loop runs the calls and the protocol turns their results into the Reply the model is shown next.


@dataclass
class Turn:
    """One model turn, whichever way its tokens came: what was sampled, how it ended, and its text."""

    ids: list[int]
    finish_type: str  # "stop" | "length" | "abort"
    text: str = ""
    log_probs: list[float] | None = None  # the engine's, one per id (manual mode with TRACK_LOG_PROBS)
    meta_info: dict = field(default_factory=dict)  # SGLang's, handed on to slime's append_response_tokens
    message: dict | None = None  # the assistant message, when a server parsed it (router_handler)
    # (start, end, weight version) over `ids`: which policy sampled which of them (manual mode)
    versions: list[tuple[int, int, str | None]] = field(default_factory=list)
    engine_aborted: bool = False  # the engine answered finish_reason abort (the turn may still have ended)


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: dict  # as the model wrote them (the recorded conversation keeps these)
    parsed: dict = field(default_factory=dict)  # as the tool read them: what it runs on
    error: str | None = None  # why the call cannot run; the model is told in the reply

    def to_dict(self) -> dict:
        return {"call_id": self.call_id, "name": self.name, "arguments": self.arguments, "parsed": self.parsed}


@dataclass
class Action:
    calls: list[ToolCall] = field(default_factory=list)  # tool calls to answer (a malformed one answers its error)
    final: bool = False  # the model gave its answer: the episode ends
    invalid: bool = False  # neither a usable call nor an answer (counted in the sample's invalid_actions)
    message: dict | None = None  # chat mode: the assistant message, as the recorded conversation keeps it


@dataclass
class Reply:
    ids: list[int]  # what the model is shown next: appended to the trajectory as observation tokens
    messages: list[dict] = field(default_factory=list)  # chat mode: the messages those ids render
    truncated: int = 0  # how many tool results were cut to fit their tool's observation budget


# ---- the ids of text the model did not write --------------------------------------------------------------------


def encode_text(tokenizer, text: str, *, special_tokens_as_text: bool = True) -> list[int]:
    """Token ids of `text` on its own; by default a special-token string in retrieved text stays text."""
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=special_tokens_as_text)


@lru_cache(maxsize=64)
def fixed_text_ids(tokenizer, text: str) -> tuple[int, ...]:
    """encode_text for the environment's fixed strings (tags, messages), computed once per tokenizer."""
    return tuple(encode_text(tokenizer, text))


@lru_cache(maxsize=4096)
def _prompt_ids(tokenizer, prompt: str) -> tuple[int, ...]:
    # GRPO rolls out every prompt n_samples_per_prompt times: tokenize it once.
    return tuple(encode_text(tokenizer, prompt, special_tokens_as_text=False))


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Prompt ids as slime computes them: the prompt string tokenized with its special tokens."""
    return list(_prompt_ids(tokenizer, prompt))


class RenderError(RuntimeError):
    """The protocol's template cannot render its reply to a turn (a chat template refusing the conversation): that
    sample ends FAILED with template_error, the rollout goes on (loop.py)."""


# ---- the record in sample.metadata["search_r1"] -----------------------------------------------------------------

METADATA_KEY = "search_r1"


class FinishReason(str, Enum):
    """How an episode ended (the loop's table, loop.py); the log hooks count each one."""

    ANSWER = "answer"
    MAX_TURNS = "max_turns"
    TOKEN_BUDGET = "token_budget"
    # the engine's context length: its length rules left no room for the next turn, or it refused one for its length
    CONTEXT_LENGTH = "context_length"
    TOOL_FAILED = "tool_failed"
    ENGINE_ERROR = "engine_error"  # the engine refused the request (4xx) or answered what cannot be trained on
    TEMPLATE_ERROR = "template_error"  # the protocol's template refused to render the reply to a turn
    ROLLOUT_ABORTED = "rollout_aborted"  # slime's abort flag, seen before a turn or while a tool waited
    ENGINE_ABORT = "engine_abort"  # the engine answered a turn with finish_reason abort


def episode_record(sample) -> dict | None:
    """The record generate() wrote on `sample`, or None for a sample this plugin did not generate."""
    record = (getattr(sample, "metadata", None) or {}).get(METADATA_KEY)
    return record if isinstance(record, dict) else None


def write_episode(sample, record: dict) -> None:
    sample.metadata[METADATA_KEY] = record


def forget_episode(sample) -> None:
    """A sample generated again from scratch (slime retries it) keeps nothing of the earlier episode."""
    sample.metadata = {k: v for k, v in (sample.metadata or {}).items() if k != METADATA_KEY}


def record_reward(sample, reward: dict, scored_by: str = "em", verdict: dict | None = None) -> None:
    """reward_func's breakdown, where the log hooks and the viewer find it: {score, em, format_valid, retrieval_hit}
    and, when the reward is not built on em, `scored_by` (f1, cover_em or judge) with that score under its name;
    with the judge, its verdict {status, score, reply, error, attempts}, and `unscored` when that verdict carries no
    score (the sample is kept out of training)."""
    record = episode_record(sample)
    if record is None:
        return
    parts = dict(reward) if scored_by == "em" else {**reward, "scored_by": scored_by}
    if verdict is not None:
        parts["judge_verdict"] = dict(verdict)
        if verdict.get("score") is None:
            parts["unscored"] = True
    record["reward"] = parts


def reward_of(record: dict) -> dict | None:
    reward = record.get("reward")
    return reward if isinstance(reward, dict) else None


def unscored(reward: dict) -> bool:
    """The judge gave this sample no usable verdict: its score is a placeholder, it is not trained on."""
    return bool(reward.get("unscored"))


def conversation_of(record: dict) -> list[dict] | None:
    """Chat mode: the episode's messages after the prompt, as OpenAI messages."""
    return record.get("conversation")


def resume_point(record: dict) -> dict | None:
    """Where an episode slime aborted stood: {"turn_index", "stage", "turn_start", "conversation_start"} (written only
    with --partial-rollout, when slime keeps the sample to resume it in a later rollout)."""
    point = record.get("resume")
    return point if isinstance(point, dict) else None


def segment_of(record: dict) -> dict | None:
    """Which of the samples an episode was split into this one is: {"index", "count", "start": where its part begins
    in the episode's response} (split_trajectories), or None for an episode trained as one sample. Every segment
    carries the whole episode's record."""
    segment = record.get("segment")
    return segment if isinstance(segment, dict) else None


def first_part_of_episode(record: dict) -> bool:
    """An episode split into several samples carries its record on each: count it once, on its first part."""
    segment = segment_of(record)
    return segment is None or segment.get("index") == 0


def tool_counters(record: dict) -> dict[str, dict]:
    """Per tool name: {"calls": finished calls, "failures": calls that failed for good, "seconds": [each call's]}."""
    return record.get("tools") or {}


# ---- which policy wrote which token -----------------------------------------------------------------------------
# SGLang answers every /generate with meta_info["weight_version"] (slime sets it at each weight update: "1", "2", ...;
# SGLang's own "default" before the first), 0.5.23 with spans of output tokens per version when the weights changed
# under a request. The record keeps [start, end, version] spans in response-token positions under "versions".

VERSIONS_KEY = "versions"


def version_spans(record: dict) -> list[tuple[int, int, str | None]]:
    """The record's spans: (start, end, weight version) per engine call that sampled tokens, in response-token
    positions, in order; they cover exactly the generated tokens (observations lie between them)."""
    return [(int(start), int(end), version) for start, end, version in record.get(VERSIONS_KEY) or ()]


def part_spans(record: dict, response_length: int) -> list[tuple[int, int, str | None]]:
    """The record's spans in this sample's own response positions: a part of a split episode (segment_of) holds the
    response from its segment's start on, so the spans are shifted there and cut to its `response_length`."""
    offset = int((segment_of(record) or {}).get("start", 0))
    spans = []
    for start, end, version in version_spans(record):
        start, end = max(start - offset, 0), min(end - offset, response_length)
        if start < end:
            spans.append((start, end, version))
    return spans


def token_versions(record: dict, response_length: int) -> list[str | None]:
    """One weight version per response token of this sample (a part of a split episode: of its part): the version
    that sampled it; None for the tokens no engine call sampled (observations, and everything in the router modes,
    which record no versions)."""
    versions: list[str | None] = [None] * response_length
    for start, end, version in part_spans(record, response_length):
        versions[start:end] = [version] * (end - start)
    return versions


def version_number(version: str | None) -> int | None:
    """Where a weight version sits in the order of updates: slime's versions count its weight updates (str of an
    int, zero-padded by some updaters); anything else (SGLang's "default" before slime's first update, or None)
    has no place in that order."""
    text = str(version).strip() if version is not None else ""
    return int(text) if text.isdigit() else None


class EngineVersions:
    """The newest ordered weight version any engine answer has shown in this process (slime's rollout manager,
    where generate(), the log hooks and the reward post-processing all run). slime pushes new weights to every
    engine before it trains on, so it is the policy the next batch is trained by, or the one before it where
    train_async.py forms a batch before its weight update."""

    def __init__(self) -> None:
        self.newest: int | None = None
        self._lock = threading.Lock()

    def observe(self, versions) -> None:
        numbers = [number for version in versions if (number := version_number(version)) is not None]
        with self._lock:
            self.newest = max([*numbers, *([] if self.newest is None else [self.newest])], default=None)

    def forget(self) -> None:
        """Start over (a new run in the same process: tests, scripts)."""
        with self._lock:
            self.newest = None


ENGINE_VERSIONS = EngineVersions()


# ---- what the episode knows while it runs -----------------------------------------------------------------------


def _status(sample) -> str:
    status = getattr(sample, "status", None)
    return str(getattr(status, "value", status))


@dataclass
class ToolStats:
    calls: int = 0  # calls that returned a result
    failures: int = 0  # calls that failed for good
    seconds: list[float] = field(default_factory=list)  # each call's time, retries included, failed ones too


@dataclass
class EpisodeStats:
    """Per-sample counters, stored in the record."""

    turns: int = 0  # model turns that finished (an aborted one is finished when it resumes)
    invalid_actions: int = 0  # finished turns with neither a usable tool call nor an answer
    observation_tokens: int = 0
    truncated_observations: int = 0  # tool results cut to fit their tool's observation budget
    tools: dict[str, ToolStats] = field(default_factory=dict)  # by tool name
    tool_error: str | None = None  # the tool error that ended the episode FAILED
    engine_error: str | None = None  # what was wrong with the engine's answer, when that ended the episode FAILED
    template_error: str | None = None  # why the template could not render a reply, when that ended it FAILED
    length_refusal: str | None = None  # the engine's refusal of a request for its length (ended it context_length)
    generated_tokens: int = 0  # model tokens in the response (observations are not)
    resumes: int = 0  # partial rollout: how often an aborted episode was resumed
    earlier_policy_tokens: int = 0  # of generated_tokens, those an earlier policy wrote (before the last resume)
    resumed_at: list[int] = field(default_factory=list)  # the response length at each resume (tokens before it: older)
    # Aborts counted from the engine's answers (finish_reason abort: slime's abort, or a weight update pausing the
    # engines in fully-async training, where slime's abort flag never turns true), over every attempt.
    engine_aborts: int = 0
    # Of those, the answers whose tokens had already ended their turn (an abort runs one more step, unchecked): the
    # turn finished there, as the engine would have finished it.
    aborts_after_turn_end: int = 0
    restarts: int = 0  # times an aborted episode started over instead of resuming (no --partial-rollout)
    lag_masked_tokens: int = 0  # generated tokens max_version_lag took out of the loss
    # long horizon (force_answer, split_trajectories, page chunks)
    forced_answer: dict | None = None  # {"mode", "turn", "trigger", "tokens"}: the answer was forced on that turn
    segments: int = 1  # samples the episode was split into for training (split_trajectories)
    page_chunks: int = 0  # page chunks the access tool showed
    short_form_tokens_saved: int = 0  # tokens the chunks read no longer take in later contexts (full - short form)

    # What counts over every attempt at the episode: an aborted sample that starts over keeps these (EpisodeState).
    OVER_ATTEMPTS = ("engine_aborts", "aborts_after_turn_end", "restarts")

    def tool(self, name: str) -> ToolStats:
        return self.tools.setdefault(name, ToolStats())

    @classmethod
    def from_record(cls, record: dict) -> "EpisodeStats":
        counters = {name: record[name] for name in cls.__dataclass_fields__ if name in record and name != "tools"}
        tools = {name: ToolStats(**dict(stats)) for name, stats in tool_counters(record).items()}
        return cls(**counters, tools=tools)


@dataclass
class EpisodeState:
    """What the loop owns and hands to the protocol, the driver and the tools; recorded on the sample at the end,
    with where it stood when slime aborted it, so that a partial rollout resumes it."""

    args: Namespace
    sample: Any  # slime's Sample
    config: Any  # the settings (settings.SearchR1Config)
    tokenizer: Any
    generate_state: Any  # slime's GenerateState: `.aborted` turns true when slime aborts the rollout
    evaluation: bool
    tools: dict  # the enabled tools, by name (tools/contract.py's Tool)
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    conversation: list[dict] | None = None  # chat mode: the OpenAI messages after the prompt, as they happen
    turn_index: int = 0  # the model turn under way, from 0
    turn_started_at: int = 0  # len(conversation) when the turn under way began
    turn_start: int = 0  # response tokens before the turn under way
    stage: str = "turn"  # "turn": generating it (or about to); "tool": it was read and its calls are to run
    pages: dict = field(default_factory=dict)  # page chunks: the pages being read, by URL (tools/access.py)

    def __post_init__(self) -> None:
        # An aborted sample handed back (slime's fully-async worker requeues its group) that starts over keeps
        # count of its aborts; one that resumes takes all its counters from its record (resume()).
        earlier = episode_record(self.sample) if _status(self.sample) == "aborted" else None
        if earlier is not None:
            for name in EpisodeStats.OVER_ATTEMPTS:
                setattr(self.stats, name, int(earlier.get(name, 0)))
            self.stats.restarts += 1

    @property
    def aborted(self) -> bool:
        return bool(self.generate_state.aborted)

    def begin_turn(self, response_length: int) -> None:
        self.turn_started_at = len(self.conversation) if self.conversation is not None else 0
        self.turn_start = response_length
        self.stage = "turn"

    def resume(self, record: dict, response_length: int) -> None:
        """Stand where an aborted episode stood (its record's resume point), with its counters and conversation;
        what it generated so far (the first `response_length` response tokens) was written by an earlier policy."""
        point = resume_point(record)
        self.stats = EpisodeStats.from_record(record)
        self.stats.resumes += 1
        self.stats.earlier_policy_tokens = self.stats.generated_tokens
        self.stats.resumed_at = [*self.stats.resumed_at, response_length]
        if self.conversation is not None:
            self.conversation = list(conversation_of(record) or [])
        self.turn_index, self.stage = point["turn_index"], point["stage"]
        self.turn_start, self.turn_started_at = point["turn_start"], point["conversation_start"]

    def history_before_turn(self) -> list[dict]:
        """The conversation before the assistant turn under way (chat mode)."""
        return (self.conversation or [])[: self.turn_started_at]

    def record(self, reason: FinishReason, *, resumable: bool, versions=()) -> dict:
        """The record of the episode that ended for `reason`; with `resumable` (slime aborted it in a partial
        rollout and hands it back later), where it stood too; `versions`: the trajectory's [start, end, version]
        spans."""
        record = asdict(self.stats)
        record.update(finish_reason=reason.value, evaluation=self.evaluation)
        record[VERSIONS_KEY] = [[start, end, version] for start, end, version in versions]
        if getattr(self.config, "max_version_lag", None) is not None:  # the lag mask slime's batch gets too
            record["max_version_lag"] = self.config.max_version_lag
        if self.conversation is not None:
            record["conversation"] = self.conversation
        if resumable:
            record["resume"] = {
                "turn_index": self.turn_index,
                "stage": self.stage,
                "turn_start": self.turn_start,
                "conversation_start": self.turn_started_at,
            }
        return record
