"""An LLM judge behind any OpenAI-compatible chat endpoint: does this answer state a gold answer's fact?

The prompt is a text file (judge_prompt.txt beside this module, or one of your own) with three placeholders,
{question}, {gold_answers} and {prediction}, filled in one pass (other braces stay as written). The default prompt
fences the prediction between <prediction> and </prediction> and tells the judge it is data to grade, not
instructions; those two tags are taken out of the prediction, so an answer cannot close its own fence.

The judge is asked to end with "Verdict: correct" or "Verdict: incorrect". read_verdict reads every reply: the
verdict is the last line, after any <think>...</think>, that is a verdict and nothing else (markdown and quotes
around it allowed), so a note that quotes a verdict inside a sentence does not count. A reply cut off at max_tokens
(finish_reason "length", or a <think> never closed) is refused whatever it holds: its thinking may carry a tentative
verdict.

Every call ends in a Verdict whose status says what happened, never a silent 0:

  correct, incorrect  the judge's verdict (score 1.0 or 0.0)
  no_answer           the model gave no answer: 0.0 without asking the judge
  invalid             the judge replied, but no verdict could be read: no verdict line after every attempt, or a
                      reply cut off at max_tokens (not retried: the same prompt would be cut off again); the reply is
                      kept
  error               no reply after every attempt (HTTP 429/5xx, a timeout, a broken connection), or an error that
                      retrying cannot fix (another HTTP 4xx); the message says which

Errors worth another try and replies without a verdict line are retried by http_client.retrying, the policy the
engine and search clients share: the server's Retry-After when it sends one (at most
http_client.RETRY_AFTER_MAX_S), else jittered exponential backoff; `attempts` tries in all. At most `concurrency`
requests are in flight per event loop, and a waiting retry holds no place. The API key is read from the environment
variable `api_key_env` names and sent as a bearer token; it is never written to a Verdict, a result or a log line.
"""

import asyncio
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tenacity import wait_random_exponential

from slime_search_r1.http_client import (
    RequestFailed,
    RetryableRequestFailed,
    loop_semaphore,
    post_json,
    retrying,
    unbounded_session,
)

DEFAULT_PROMPT = Path(__file__).with_name("judge_prompt.txt")
PLACEHOLDERS = ("question", "gold_answers", "prediction")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
# The fence of the prediction in the default prompt; a prediction that writes these tags has them taken out.
_FENCE_TAG = re.compile(r"</?\s*prediction\s*>", re.IGNORECASE)
# A line that is a verdict and nothing else: "Verdict: correct", "**Verdict:** Incorrect.", '{"verdict": "correct"}'
_VERDICT_LINE = re.compile(r"[\s*_`\"'{#-]*verdict[\s*_`\"':=-]*(correct|incorrect)[\s*_`\"'}.!]*", re.IGNORECASE)
_REFUSED = re.compile(r"HTTP 40[13]\b")
_KEPT_REPLY_CHARS = 4000  # a verdict line keeps this much of the judge's reply

STATUSES = ("correct", "incorrect", "no_answer", "invalid", "error")
SCORED = ("correct", "incorrect", "no_answer")  # the statuses that carry a score; the others mark the sample


class JudgeSetupError(ValueError):
    """A judge setting that cannot work; the message says what is accepted."""


def chat_completions_url(url: str) -> str:
    """The endpoint to POST to: a base URL as OpenAI clients take it (http://host:8000/v1) gets /chat/completions."""
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise JudgeSetupError(f"must be an http(s) URL such as http://127.0.0.1:8000/v1, got {url!r}")
    path = split.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urlunsplit((split.scheme, split.netloc, path, split.query, ""))


def without_credentials(url: str) -> str:
    """The URL as results may record it: no user:password@ part, no query string."""
    split = urlsplit(url)
    host = split.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if split.port:
        netloc += f":{split.port}"
    return urlunsplit((split.scheme, netloc, split.path, "", ""))


@dataclass(frozen=True)
class JudgePrompt:
    template: str
    path: str

    @classmethod
    def load(cls, path: Path | None = None) -> "JudgePrompt":
        path = Path(path) if path is not None else DEFAULT_PROMPT
        try:
            template = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise JudgeSetupError(f"cannot read {path}: {exc}") from None
        missing = [name for name in PLACEHOLDERS if "{" + name + "}" not in template]
        if missing:
            raise JudgeSetupError(
                f"{path} lacks {', '.join('{' + m + '}' for m in missing)}; a judge prompt must hold "
                + ", ".join("{" + name + "}" for name in PLACEHOLDERS)
            )
        return cls(template, str(path))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()

    def render(self, question: str, golden_answers: list[str], prediction: str) -> str:
        values = {
            "question": question,
            "gold_answers": " | ".join(golden_answers),
            "prediction": _FENCE_TAG.sub("", prediction),
        }
        return _PLACEHOLDER.sub(lambda match: values[match.group(1)], self.template)


class UnreadableReply(RetryableRequestFailed):
    """The judge replied, but with no verdict line in it (or not in the OpenAI shape): worth another try."""

    def __init__(self, message: str, reply: str | None):
        super().__init__(message)
        self.reply = reply


class CutOffReply(RequestFailed):
    """The judge's reply was cut off at max_tokens: not retried, the same prompt would be cut off again."""

    def __init__(self, message: str, reply: str | None):
        super().__init__(message)
        self.reply = reply


def read_verdict(reply: str, finish_reason: str | None = None) -> bool:
    """True for correct, False for incorrect: the last verdict line of a finished reply, after its thinking.

    Raises CutOffReply for a reply cut off at max_tokens (finish_reason "length", or an unclosed <think>), and
    UnreadableReply when no line after the thinking is a verdict and nothing else."""
    after_thinking = reply.rsplit("</think>", 1)[-1]
    if finish_reason == "length" or "<think>" in after_thinking:
        where = "finish_reason length" if finish_reason == "length" else "its <think> never closed"
        more = "give it more: --judge-max-tokens, or judge.max_tokens in training"
        raise CutOffReply(f"the reply was cut off at max_tokens ({where}); {more}", reply)
    verdicts = [line.group(1) for line in map(_VERDICT_LINE.fullmatch, after_thinking.splitlines()) if line]
    if not verdicts:
        raise UnreadableReply("no line that is only 'Verdict: correct' or 'Verdict: incorrect'", reply)
    return verdicts[-1].lower() == "correct"


@dataclass(frozen=True)
class JudgeConfig:
    url: str
    model: str
    api_key_env: str = "JUDGE_API_KEY"
    concurrency: int = 32
    attempts: int = 4
    timeout: float = 60.0
    max_tokens: int = 1024
    temperature: float = 0.0
    backoff: float = 0.5  # the first retry waits up to this many seconds, doubling per attempt (jittered)

    def __post_init__(self):
        chat_completions_url(self.url)
        for name in ("model", "api_key_env"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise JudgeSetupError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("concurrency", "attempts", "max_tokens"):
            if getattr(self, name) < 1:
                raise JudgeSetupError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout <= 0 or self.backoff < 0 or self.temperature < 0:
            raise JudgeSetupError(
                f"timeout must be > 0 and backoff, temperature >= 0; got {self.timeout}, {self.backoff}, "
                f"{self.temperature}"
            )


@dataclass(frozen=True)
class Verdict:
    status: str  # one of STATUSES
    score: float | None  # 1.0, 0.0, or None for a marked sample (invalid, error)
    reply: str | None = None  # the judge's last reply, cut to _KEPT_REPLY_CHARS
    error: str | None = None
    attempts: int = 0  # requests sent

    @property
    def scored(self) -> bool:
        return self.status in SCORED

    def as_dict(self) -> dict:
        return asdict(self)


class JudgeClient:
    """judge(question, golds, prediction) -> Verdict, for evaluate.py and for a judge-based reward alike."""

    def __init__(self, config: JudgeConfig, prompt: JudgePrompt | None = None, api_key: str | None = None):
        """`api_key`: the key itself when the caller read it already (the training settings); else the environment
        variable config.api_key_env is read."""
        self.config = config
        self.prompt = prompt or JudgePrompt.load()
        self.endpoint = chat_completions_url(config.url)
        self._api_key = api_key or os.environ.get(config.api_key_env) or None
        self._wait = wait_random_exponential(multiplier=config.backoff, max=max(config.backoff * 16, 0.0))

    @property
    def identity(self) -> dict:
        """What makes two verdicts comparable: the judge model and the prompt it was given."""
        return {"model": self.config.model, "prompt_sha256": self.prompt.sha256}

    def describe(self) -> dict:
        """The judge as results record it (no key, no credentials in the URL)."""
        return {
            **self.identity,
            "url": without_credentials(self.endpoint),
            "prompt_file": self.prompt.path,
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
            "api_key_env": self.config.api_key_env,
            "api_key_set": self._api_key is not None,
        }

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    async def _ask(self, prompt: str) -> tuple[str, str | None]:
        """The reply's content and finish_reason."""
        payload = {
            "model": self.config.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        session = unbounded_session("judge")
        async with loop_semaphore(f"judge {self.endpoint}", self.config.concurrency):
            try:
                body = await post_json(session, self.endpoint, payload, self.config.timeout, headers=headers)
            except RetryableRequestFailed:
                raise
            except RequestFailed as exc:
                if isinstance(exc.__cause__, (ValueError, RecursionError)):  # a reply, but not JSON
                    raise UnreadableReply(str(exc), None) from exc
                raise
        try:
            choice = body["choices"][0]
            content, finish_reason = choice["message"]["content"], choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            content = finish_reason = None
        if finish_reason == "length" and content is None:  # a reasoning parser kept the unfinished thinking apart
            content = ""
        if not isinstance(content, str):
            raw = json.dumps(body, ensure_ascii=False)[:_KEPT_REPLY_CHARS]
            raise UnreadableReply(f"{self.endpoint} answered without choices[0].message.content: {raw[:200]}", raw)
        return content, finish_reason if isinstance(finish_reason, str) else None

    async def judge(self, question: str, golden_answers: list[str], prediction: str | None) -> Verdict:
        if prediction is None or not prediction.strip():
            return Verdict("no_answer", 0.0)
        prompt = self.prompt.render(question, list(golden_answers), prediction)
        attempts = 0
        try:
            async for attempt in retrying(self.config.attempts, wait=self._wait):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    reply, finish_reason = await self._ask(prompt)
                    verdict = read_verdict(reply, finish_reason)
        except (UnreadableReply, CutOffReply) as exc:
            reply = None if exc.reply is None else self._redact(exc.reply)[:_KEPT_REPLY_CHARS]
            return Verdict("invalid", None, reply=reply, error=self._redact(str(exc)), attempts=attempts)
        except RequestFailed as exc:
            message = self._redact(str(exc))
            if isinstance(exc.__cause__, asyncio.TimeoutError):
                message += f" (no reply within {self.config.timeout:g} s)"
            elif _REFUSED.search(message):
                message += f" (is ${self.config.api_key_env} set to the endpoint's key?)"
            return Verdict("error", None, error=message, attempts=attempts)
        reply = self._redact(reply)[:_KEPT_REPLY_CHARS]
        return Verdict("correct" if verdict else "incorrect", float(verdict), reply=reply, attempts=attempts)
