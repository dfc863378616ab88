"""aiohttp plumbing shared by the engine and search clients: per-event-loop sessions, errors, bounded retries.

httpx (which slime's post() uses) spends ~20 ms of CPU per request at 512 concurrent connections on
this machine against ~0.6 ms for aiohttp (bench/rollout_overhead.py), so the hot paths use aiohttp.
"""

import asyncio
from collections.abc import Callable

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_any, wait_random_exponential

# A session or semaphore belongs to the event loop it was made on; slime runs one loop, tests run many.
_per_loop: dict[asyncio.AbstractEventLoop, dict] = {}


class RequestFailed(RuntimeError):
    """A request that failed for good (after retries, or on an error that retrying cannot fix)."""


class RetryableRequestFailed(RequestFailed):
    """Connection errors, timeouts, 5xx and 429: worth another attempt."""


def _loop_state() -> dict:
    loop = asyncio.get_running_loop()
    if loop not in _per_loop:
        for closed in [other for other in _per_loop if other.is_closed()]:
            del _per_loop[closed]  # their sessions cannot be used (or closed) any more
        _per_loop[loop] = {}
    return _per_loop[loop]


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
    """Close this loop's sessions (tests and scripts call it before their loop ends)."""
    state = _per_loop.pop(asyncio.get_running_loop(), {})
    for key, value in state.items():
        if key[0] == "session":
            await value.close()


def retrying(max_attempts: int, wait=None, before_sleep=None, give_up: Callable[[], bool] | None = None):
    """Retry RetryableRequestFailed, `max_attempts` tries in all (fewer once `give_up()` is true);
    full-jitter exponential backoff by default."""
    stop = stop_after_attempt(max_attempts)
    if give_up is not None:
        stop = stop_any(stop, lambda _: give_up())
    return AsyncRetrying(
        stop=stop,
        wait=wait or wait_random_exponential(multiplier=0.2, max=4.0),
        retry=retry_if_exception_type(RetryableRequestFailed),
        reraise=True,
        before_sleep=before_sleep,
    )


async def post_json(
    session: aiohttp.ClientSession, url: str, payload: dict, timeout: float | None, **kwargs
) -> object:
    """POST JSON and return the decoded body, mapping failures onto the two error classes."""
    try:
        async with session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout), **kwargs) as resp:
            if resp.status == 429 or resp.status >= 500:
                raise RetryableRequestFailed(f"{url} answered HTTP {resp.status}")
            if resp.status >= 400:
                detail = (await resp.text())[:300]
                raise RequestFailed(f"{url} rejected the request with HTTP {resp.status}: {detail}")
            return await resp.json(content_type=None)
    except (aiohttp.ContentTypeError, ValueError) as exc:
        raise RequestFailed(f"{url} did not answer with JSON: {exc}") from exc
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # connection, payload, proxy errors, timeouts
        raise RetryableRequestFailed(f"{url}: {type(exc).__name__}: {exc}") from exc
