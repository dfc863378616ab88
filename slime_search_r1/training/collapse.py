"""Early warnings of a collapse, from what a rollout already holds: each sample's generated tokens and their rollout
log probs, its text, its record and its reward. No engine call, no tokenizer.

Runs that collapse into repetition or word salad (slime issue 1533, Search-R1 issue 186) show it in these signals
rollouts before the reward falls. Logged under the hooks' prefixes as health/<signal>:

  neg_log_prob            mean -log p of the generated tokens (loss mask 1) under the rollout's log probs: an entropy
                          proxy
  repetition_share        share of responses in which at least LOOP_SHARE of the generated LOOP_N-grams (token ids)
                          repeat an earlier one of the same response: a loop
  foreign_script_share    share of responses with at least FOREIGN_LETTERS letters the model wrote in a script that
                          neither the prompt nor what the tools returned uses (by Unicode name: LATIN, CJK, ...)
  no_answer_share         share of responses with no closing </answer> (FAILED samples, whose tool broke, not counted)
  reasoning_chars         mean characters the model wrote before its first tool call (samples that called a tool)
  top_reward_log_prob     mean rollout log prob per generated token of the responses with the top reward of their GRPO
                          group (groups whose rewards differ): the responses the update pushes up. Falling while the
                          reward holds is the likelihood displacement that preceded the collapse in Search-R1 issue 186

and, against the mean of the previous WINDOW rollouts (once WARMUP of them were seen), <signal>_change: relative for
neg_log_prob and reasoning_chars, in its own unit (nats per token, share) for top_reward_log_prob and no_answer_share.
BANDS says where each is healthy; CollapseWatch.observe gives a warning for each signal outside its band.
"""

import re
import unicodedata
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean

import numpy as np

from slime_search_r1.episode import conversation_of, reward_of, tool_counters, unscored
from slime_search_r1.protocols.xml_tags import INFORMATION_PATTERN

HEALTH = "health/"
LOOP_N = 8  # tokens per n-gram
LOOP_SHARE = 0.3  # of a response's n-grams repeating an earlier one: a loop
FOREIGN_LETTERS = 5  # letters in a script the context does not use
WINDOW = 5  # previous rollouts a change is measured against
WARMUP = 3  # previous rollouts needed before a change is given
_INVALID_ACTION = re.compile(r"\nMy previous action is invalid\. .*? Let me try again\.\n", re.DOTALL)
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_ASCII_LETTER = re.compile(r"[A-Za-z]")
_HASH_BASE = np.uint64(1_000_003)


@dataclass(frozen=True)
class Band:
    """Where a signal is healthy, and what leaving it usually means and what users change."""

    signal: str
    low: float | None
    high: float | None
    below: str = ""
    above: str = ""


# Relative changes are fractions (-0.5: half of the previous rollouts' mean); log probs are nats per token.
BANDS = (
    Band(
        "neg_log_prob_change",
        -0.5,
        0.5,
        below="the policy turns deterministic (entropy collapse), often repetition next: lower the learning rate, "
        "check that the rollout temperature is 1",
        above="the policy samples ever less likely tokens (word salad; slime issue 1533 saw it with TIS on): check "
        "the TIS settings (--use-tis and its clip bounds) and the train/rollout log-prob gap, lower the learning rate",
    ),
    Band(
        "repetition_share",
        None,
        0.05,
        above="responses loop on the same tokens: lower the learning rate, check the TIS settings; a format bonus "
        "earned without an answer (well_formed_wrong_share) can feed it",
    ),
    Band(
        "foreign_script_share",
        None,
        0.05,
        above="responses drift into other scripts (word salad, language mixing): check the TIS settings, lower the "
        "learning rate",
    ),
    Band(
        "no_answer_share_change",
        None,
        0.2,
        above="responses stop giving an answer: searching without concluding (raise SEARCH_R1_MAX_TURNS or "
        "--rollout-max-response-len) or a collapse that never reaches </answer>",
    ),
    Band(
        "reasoning_chars_change",
        -0.5,
        1.0,
        below="the reasoning before a search is vanishing: the policy may farm the format bonus (lower "
        "SEARCH_R1_FORMAT_SCORE) or be collapsing",
        above="the reasoning before a search balloons, which often precedes loops: lower the learning rate, lower "
        "SEARCH_R1_MAX_TURNS if it searches in circles",
    ),
    Band(
        "top_reward_log_prob_change",
        -0.15,
        None,
        below="the likelihood of the responses GRPO rewards is falling (likelihood displacement, Search-R1 issue "
        "186), which precedes a collapse while the reward still holds: lower the learning rate, check the TIS "
        "settings",
    ),
)
# signal -> how its change is measured: relative to the previous rollouts' mean, or as a difference
CHANGES = {
    "neg_log_prob": "relative",
    "no_answer_share": "difference",
    "reasoning_chars": "relative",
    "top_reward_log_prob": "difference",
}


# ---- one sample -------------------------------------------------------------------------------------------------


def generated(sample) -> tuple[np.ndarray, np.ndarray | None]:
    """The token ids the model generated (loss mask 1) and their rollout log probs (None without them), from slime's
    Sample (tokens) or the viewer's (response_ids)."""
    length = int(getattr(sample, "response_length", 0) or 0)
    ids = getattr(sample, "response_ids", None)
    if ids is None:
        tokens = getattr(sample, "tokens", None) or []
        ids = tokens[len(tokens) - length :] if length else []
    ids = np.asarray(ids, dtype=np.int64)
    mask = getattr(sample, "loss_mask", None)
    keep = np.asarray(mask, dtype=bool) if mask is not None and len(mask) == len(ids) else np.ones(len(ids), bool)
    log_probs = getattr(sample, "rollout_log_probs", None)
    if log_probs is None or len(log_probs) != len(ids):
        return ids[keep], None
    return ids[keep], np.asarray(log_probs, dtype=np.float64)[keep]


def repeated_ngram_share(ids: np.ndarray, n: int = LOOP_N) -> float:
    """The share of the n-grams of `ids` that repeat an earlier one (hashed, so one pass)."""
    count = len(ids) - n + 1
    if count < 2:
        return 0.0
    hashes = np.zeros(count, dtype=np.uint64)
    for offset in range(n):
        hashes = hashes * _HASH_BASE + ids[offset : offset + count].astype(np.uint64)  # wraps around, as a hash may
    return (count - np.unique(hashes).size) / count


def texts(sample, record: dict) -> tuple[str, str]:
    """(what the model wrote, what it was shown) in its response: chat mode from the recorded conversation, XML mode
    the response without its <information> blocks and invalid-action messages."""
    conversation = conversation_of(record)
    if isinstance(conversation, list):
        written, shown = [], []
        for message in conversation:
            if message.get("role") == "assistant":
                written += [message.get("content") or "", message.get("text_after_tool_calls") or ""]
            else:
                shown.append(str(message.get("content") or ""))
        return "\n".join(written), "\n".join(shown)
    response = getattr(sample, "response", "") or ""
    shown = INFORMATION_PATTERN.findall(response) + _INVALID_ACTION.findall(response)
    return _INVALID_ACTION.sub(" ", INFORMATION_PATTERN.sub(" ", response)), "\n".join(shown)


def prompt_text(sample) -> str:
    prompt = getattr(sample, "prompt", "") or ""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content") or "") for m in prompt if isinstance(m, dict))


def script_of(letter: str) -> str:
    """A letter's script as its Unicode name starts: LATIN, CJK, CYRILLIC, HIRAGANA, ARABIC, ..."""
    return unicodedata.name(letter, "UNKNOWN").split(" ", 1)[0]


def scripts_in(text: str) -> set[str]:
    found = {script_of(ch) for ch in _NON_ASCII.findall(text) if ch.isalpha()}
    return found | ({"LATIN"} if _ASCII_LETTER.search(text) else set())


def foreign_letters(written: str, context: str) -> int:
    """Letters of `written` in a script `context` does not use."""
    allowed = scripts_in(context)
    count = 0 if "LATIN" in allowed else len(_ASCII_LETTER.findall(written))
    return count + sum(1 for ch in _NON_ASCII.findall(written) if ch.isalpha() and script_of(ch) not in allowed)


def reasoning_before_first_call(sample, record: dict, written: str) -> int | None:
    """Characters the model wrote before its first tool call; None when it called none."""
    calls = tool_counters(record)
    if not any(c.get("calls", 0) + c.get("failures", 0) for c in calls.values()):
        return None
    conversation = conversation_of(record)
    if isinstance(conversation, list):
        chars = 0
        for message in conversation:
            if message.get("role") == "assistant":
                chars += len((message.get("content") or "").strip())
                if message.get("tool_calls"):
                    return chars
        return None
    tags = "|".join(re.escape(name) for name in {"search", *calls})
    first = re.search(rf"<({tags})>", written)
    return len(written[: first.start()].strip()) if first else None


# ---- one rollout ------------------------------------------------------------------------------------------------


def health_signals(episodes: Iterable[tuple[object, dict]]) -> dict[str, float]:
    """The signals (without their changes) of one rollout's (sample, record) pairs, as health/<signal>."""
    nll_sum, nll_count = 0.0, 0
    loops, foreign, no_answer, answerable, reasoning = [], [], [], 0, []
    groups: dict[object, list[tuple[float, float]]] = defaultdict(list)  # group -> (reward, mean log prob)
    for sample, record in episodes:
        ids, log_probs = generated(sample)
        if log_probs is not None and len(log_probs):
            nll_sum -= float(log_probs.sum())
            nll_count += len(log_probs)
        loops.append(repeated_ngram_share(ids) >= LOOP_SHARE)
        written, shown = texts(sample, record)
        foreign.append(foreign_letters(written, prompt_text(sample) + "\n" + shown) >= FOREIGN_LETTERS)
        status = getattr(getattr(sample, "status", None), "value", getattr(sample, "status", None))
        if status not in ("failed", "aborted"):
            answerable += 1
            no_answer.append("</answer>" not in written)
        chars = reasoning_before_first_call(sample, record, written)
        if chars is not None:
            reasoning.append(chars)
        reward = reward_of(record)
        group = getattr(sample, "group_index", None)
        removed = getattr(sample, "remove_sample", False)
        if reward is not None and not unscored(reward) and not removed and group is not None and log_probs is not None:
            if len(log_probs):
                groups[group].append((float(reward.get("score") or 0.0), float(log_probs.mean())))
    signals: dict[str, float] = {}
    if nll_count:
        signals["neg_log_prob"] = nll_sum / nll_count
    if loops:
        signals["repetition_share"] = fmean(loops)
        signals["foreign_script_share"] = fmean(foreign)
    if answerable:
        signals["no_answer_share"] = fmean(no_answer)
    if reasoning:
        signals["reasoning_chars"] = fmean(reasoning)
    top = []
    for members in groups.values():
        rewards = [reward for reward, _ in members]
        if len(members) > 1 and max(rewards) > min(rewards):
            top += [log_prob for reward, log_prob in members if reward == max(rewards)]
    if top:
        signals["top_reward_log_prob"] = fmean(top)
    return {HEALTH + name: value for name, value in signals.items()}


# ---- across rollouts --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alarm:
    signal: str  # health/<name>
    value: float
    band: Band

    @property
    def side(self) -> str:
        return "below" if self.band.low is not None and self.value < self.band.low else "above"

    @property
    def message(self) -> str:
        low, high = self.band.low, self.band.high
        if low is not None and high is not None:
            healthy = f"{low:g} to {high:g}"
        else:
            healthy = f"at least {low:g}" if low is not None else f"at most {high:g}"
        meaning = self.band.below if self.side == "below" else self.band.above
        return f"{self.signal} = {self.value:.3g} is {self.side} its healthy band ({healthy}): {meaning}"


class CollapseWatch:
    """Each rollout's signals against the previous ones: observe() returns the changes and the alarms."""

    def __init__(self, window: int = WINDOW, warmup: int = WARMUP):
        self.warmup = warmup
        self.history: dict[str, deque] = defaultdict(lambda: deque(maxlen=window))

    def observe(self, signals: dict[str, float]) -> tuple[dict[str, float], list[Alarm]]:
        """`signals`: one rollout's health/<signal> values (more metrics may be there; they are ignored)."""
        changes = {}
        for name, kind in CHANGES.items():
            value = signals.get(HEALTH + name)
            if value is None:
                continue
            previous = self.history[name]
            if len(previous) >= self.warmup:
                baseline = fmean(previous)
                if kind == "difference":
                    changes[f"{HEALTH}{name}_change"] = value - baseline
                elif baseline:
                    changes[f"{HEALTH}{name}_change"] = (value - baseline) / abs(baseline)
            previous.append(value)
        found = {**signals, **changes}
        alarms = []
        for band in BANDS:
            value = found.get(HEALTH + band.signal)
            if value is None:
                continue
            if (band.low is not None and value < band.low) or (band.high is not None and value > band.high):
                alarms.append(Alarm(HEALTH + band.signal, value, band))
        return changes, alarms
