"""Waiting for what a loopback server signals (a request arrived, a request is held in flight), never for time."""

import asyncio
import threading


async def until_set(event: threading.Event, *tasks: asyncio.Future) -> None:
    """Returns once `event` is set (by a server thread); fails at once if one of `tasks` ends first, with that task's
    own error if it raised: the request it was to send never came."""
    waiting = asyncio.ensure_future(asyncio.to_thread(event.wait))
    done, _ = await asyncio.wait({waiting, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    if waiting in done:
        return
    event.set()  # frees the thread that waits on it
    for task in done:
        task.result()
    raise AssertionError("the episode ended before the request the test waits for arrived")
