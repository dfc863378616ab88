"""Stand-in for slime.utils.async_utils: run() hands a coroutine to one process-wide event loop on a daemon thread
and blocks until it is done (slime's rollout functions are called synchronously by its rollout manager)."""

import asyncio
import threading

__all__ = ["get_async_loop", "run"]


class AsyncLoopThread:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._start_loop, daemon=True)
        self._thread.start()

    def _start_loop(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


async_loop = None


def get_async_loop():
    global async_loop
    if async_loop is None:
        async_loop = AsyncLoopThread()
    return async_loop


def run(coro):
    """Run a coroutine in the background event loop and return its result."""
    return get_async_loop().run(coro)
