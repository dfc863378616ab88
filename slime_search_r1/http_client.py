"""aiohttp plumbing shared by the engine, search and judge clients: per-event-loop sessions, errors, bounded answers,
and the one retry policy they all use (`retrying`).

The retry policy: connection errors, timeouts, HTTP 5xx and 429 are tried again, up to the caller's number of
attempts. Between two attempts it waits what the server asked for in a Retry-After header (seconds or an HTTP date,
on any of those answers), at most RETRY_AFTER_MAX_S, or else the caller's backoff. A caller that can be aborted
passes `give_up`: a wait ends as soon as it turns true, and no further attempt is made.

httpx (which slime's post() uses) spends ~20 ms of CPU per request at 512 concurrent connections on
this machine against ~0.6 ms for aiohttp (bench/rollout_overhead.py), so the hot paths use aiohttp.
"""

import asyncio
import atexit
import codecs
import datetime
import email.utils
import json
import math
import time
from collections.abc import Callable

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_any, wait_random_exponential

_CHUNK_BYTES = 64 * 1024
# An error answer's body is read only this far: enough for FastAPI's {"detail": ...} or serper's message.
_ERROR_DETAIL_CHARS = 300
_ERROR_DETAIL_BYTES = 4 * _ERROR_DETAIL_CHARS  # UTF-8 takes at most 4 bytes a character

# What one search answer may weigh, per request. A wiki-18 hit is ~0.7 KB of JSON; 64 KiB a hit leaves room for
# long-document corpora and \\u-escaped text, and is far more than one observation shows (max_obs_tokens, 500 by
# default, is ~2-3 KB). The base covers the envelope (serper adds a knowledge graph, related searches, ...).
# topk 3: 256 KiB; topk 100: 6.3 MiB. 256 searches in flight at topk 3 hold at most 64 MiB.
_ANSWER_BYTES_PER_HIT = 64 * 1024
_ANSWER_BASE_BYTES = 64 * 1024

# The longest Retry-After obeyed: a server that asks for more gets its next attempt after this long. A hosted API's
# rate limit asks for seconds to a minute; a longer wait would hold a sample (or an evaluation) for nothing.
RETRY_AFTER_MAX_S = 60.0
# How often a wait between attempts checks `give_up` (slime's abort): an abort is never held up longer than this.
GIVE_UP_CHECK_S = 0.5

# A session or semaphore belongs to the event loop it was made on; slime runs one loop, tests and scripts run many.
_per_loop: dict[asyncio.AbstractEventLoop, dict] = {}


class RequestFailed(RuntimeError):
    """A request that failed for good (after retries, or on an error that retrying cannot fix)."""


class RetryableRequestFailed(RequestFailed):
    """Connection errors, timeouts, 5xx and 429: worth another attempt (after `retry_after` seconds when the server
    said so). `status`: the HTTP status the server answered, None when it was not reached (or did not answer)."""

    def __init__(self, message: str, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The wait a Retry-After header asks for, in seconds: delay-seconds or an HTTP date (RFC 9110, 10.2.3), a date
    in the past being 0; None when there is none or it cannot be read. `now`: the Unix time to count from."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000": an HTTP date is GMT all the same
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def answer_byte_limit(topk: int) -> int:
    """The most bytes a search backend's answer for `topk` hits may have; longer ones are refused."""
    return _ANSWER_BASE_BYTES + topk * _ANSWER_BYTES_PER_HIT


def _loop_state() -> dict:
    loop = asyncio.get_running_loop()
    state = _per_loop.get(loop)
    if state is None:
        for closed in [other for other in _per_loop if other.is_closed()]:
            del _per_loop[closed]  # their sessions were closed with them (below)
        state = _per_loop[loop] = {}
        _close_with_the_loop(loop, state)
    return state


async def _close_sessions(state: dict) -> None:
    for key, value in list(state.items()):
        if key[0] == "session":
            await value.close()


async def _sessions_closer(state: dict):
    try:
        yield
    finally:
        await _close_sessions(state)


def _close_with_the_loop(loop: asyncio.AbstractEventLoop, state: dict) -> None:
    """Close this loop's sessions when the loop shuts down: asyncio.run() (any asyncio.Runner) closes the async
    generators still open before it closes the loop, and this one closes the sessions then. A session left open
    would log "Unclosed client session" and every pooled connection when it is collected."""
    closer = _sessions_closer(state)
    state[("closer",)] = closer  # the loop tracks async generators weakly
    loop.create_task(closer.__anext__())


@atexit.register
def _close_at_exit() -> None:
    """A loop that never shuts down (slime's rollout loop runs forever on a daemon thread) has its sessions closed
    when the process exits; atexit runs while daemon threads still run."""
    for loop, state in list(_per_loop.items()):
        try:
            if loop.is_closed():
                continue
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(_close_sessions(state), loop).result(timeout=10)
            else:
                loop.run_until_complete(_close_sessions(state))
        except Exception:  # never fail an exit over it; the worst left is the warning this avoids
            pass


def loop_session(key: str, factory: Callable[[], aiohttp.ClientSession]) -> aiohttp.ClientSession:
    """One aiohttp session per (event loop, key), created on first use and reused after."""
    state = _loop_state()
    session = state.get(("session", key))
    if session is None or session.closed:
        session = state[("session", key)] = factory()
    return session


def unbounded_session(key: str) -> aiohttp.ClientSession:
    """A loop session without aiohttp's 100-connection cap: the caller's semaphore (or slime) bounds concurrency."""
    return loop_session(key, lambda: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))


def loop_semaphore(key: str, limit: int) -> asyncio.Semaphore:
    state = _loop_state()
    semaphore = state.get(("semaphore", key, limit))
    if semaphore is None:
        semaphore = state[("semaphore", key, limit)] = asyncio.Semaphore(limit)
    return semaphore


async def close_loop_sessions() -> None:
    """Close this loop's sessions now (tests and scripts that keep their loop call it when they are done)."""
    await _close_sessions(_per_loop.pop(asyncio.get_running_loop(), {}))


async def pause(seconds: float, give_up: Callable[[], bool] | None = None) -> None:
    """The wait between two attempts; with `give_up`, over as soon as it turns true."""
    if give_up is None:
        await asyncio.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while not give_up() and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, GIVE_UP_CHECK_S))


class _Waits:
    """One retry loop's waits: the server's Retry-After (at most RETRY_AFTER_MAX_S), else the backoff."""

    def __init__(self, backoff, give_up: Callable[[], bool] | None):
        self.backoff = backoff
        self.give_up = give_up
        self.failure: BaseException | None = None

    def wait(self, retry_state) -> float:
        self.failure = retry_state.outcome.exception()
        asked = getattr(self.failure, "retry_after", None)
        return min(asked, RETRY_AFTER_MAX_S) if asked is not None else self.backoff(retry_state)

    async def sleep(self, seconds: float) -> None:
        await pause(seconds, self.give_up)
        if self.give_up is not None and self.give_up():
            raise self.failure  # no further attempt: the caller sees the last failure


def retrying(max_attempts: int, wait=None, before_sleep=None, give_up: Callable[[], bool] | None = None):
    """Retry RetryableRequestFailed, `max_attempts` tries in all (fewer once `give_up()` is true), waiting a
    server's Retry-After (bounded) or else `wait` (full-jitter exponential backoff by default) between them."""
    stop = stop_after_attempt(max_attempts)
    if give_up is not None:
        stop = stop_any(stop, lambda _: give_up())
    waits = _Waits(wait or wait_random_exponential(multiplier=0.2, max=4.0), give_up)
    return AsyncRetrying(
        stop=stop,
        wait=waits.wait,
        sleep=waits.sleep,
        retry=retry_if_exception_type(RetryableRequestFailed),
        reraise=True,
        before_sleep=before_sleep,
    )


async def read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The (decompressed) body, or None as soon as it is known to be longer than `limit` bytes."""
    if resp.content_length is not None and resp.content_length > limit:
        return None  # refused before reading a byte
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(_CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def read_prefix(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The first `limit` bytes of the (decompressed) body; the rest is left unread."""
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(_CHUNK_BYTES):
        chunks.append(chunk[: limit - size])
        size += len(chunks[-1])
        if size >= limit:
            break
    return b"".join(chunks)


def _charset(resp: aiohttp.ClientResponse) -> str:
    """The declared charset when Python knows it, else UTF-8 (JSON's own, RFC 8259)."""
    try:
        return codecs.lookup(resp.charset or "utf-8").name
    except LookupError:
        return "utf-8"


async def _error_detail(resp: aiohttp.ClientResponse) -> str:
    """The start of an error answer's body on one line (what the server said went wrong)."""
    data = b""
    while len(data) < _ERROR_DETAIL_BYTES and (chunk := await resp.content.read(_ERROR_DETAIL_BYTES - len(data))):
        data += chunk
    return " ".join(data.decode(_charset(resp), errors="replace").split())[:_ERROR_DETAIL_CHARS]


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict,
    timeout: float | None,
    *,
    max_body_bytes: int | None = None,
    **kwargs,
) -> object:
    """POST JSON and return the decoded body, mapping failures onto the two error classes.

    `max_body_bytes` refuses a longer answer without reading the rest (the search clients set it per request;
    the engine's answers have no such bound: long generations with log probs are legitimately large).
    """
    try:
        async with session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout), **kwargs) as resp:
            if resp.status == 429 or resp.status >= 500:
                retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
                asked = "" if retry_after is None else f" (Retry-After {retry_after:g} s)"
                raise RetryableRequestFailed(
                    f"{url} answered HTTP {resp.status}{asked}: {await _error_detail(resp)}", retry_after, resp.status
                )
            if resp.status >= 400:
                detail = await _error_detail(resp)
                raise RequestFailed(f"{url} rejected the request with HTTP {resp.status}: {detail}")
            raw = await (resp.read() if max_body_bytes is None else read_at_most(resp, max_body_bytes))
            if raw is None:
                raise RequestFailed(f"{url} answered more than {max_body_bytes} bytes, the limit for this request")
            text = raw.decode(_charset(resp)).strip()
        return json.loads(text) if text else None  # an empty body is None, as aiohttp's resp.json() has it
    except RecursionError as exc:  # the C decoder recurses once per level, bounded by the recursion limit
        raise RequestFailed(f"{url} answered JSON nested too deeply to decode") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise RequestFailed(f"{url} did not answer with JSON: {exc}") from exc
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # connection, payload, proxy errors, timeouts
        raise RetryableRequestFailed(f"{url}: {type(exc).__name__}: {exc}") from exc
