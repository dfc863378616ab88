"""slime's rollout with an abort at a chosen point, as the partial-rollout tests (and the model-family tests) drive it:
GenerateState.submit_generate_tasks -> generate_and_rm_group -> generate(), and slime's abort()."""

import asyncio
import threading

from slime.rollout.sglang_rollout import GenerateState, abort
from slime.utils.types import Sample


async def run_rollout(args, groups: list[list[Sample]]) -> list[list[Sample]]:
    """One rollout that nothing interrupts: every group to its end."""
    state = GenerateState(args)
    state.submit_generate_tasks(groups)
    done = await asyncio.gather(*state.pendings)
    state.reset()
    return list(done)


async def reached(event: threading.Event, state) -> bool:
    """Waits until `event` is set by a held request, or every task finished first (then False)."""
    waiting = asyncio.ensure_future(asyncio.to_thread(event.wait))
    everything = asyncio.ensure_future(asyncio.wait(set(state.pendings)))
    done, _ = await asyncio.wait({waiting, everything}, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        event.set()  # frees the waiting thread
    everything.cancel()
    return waiting in done and not everything.done()


async def rollout_aborted_mid_generation(engine, args, groups, call: int, tokens: int, rollout_id: int):
    """A rollout that slime aborts while the `call`-th engine request from now holds `tokens` sampled tokens."""
    hold = engine.hold_call(len(engine.calls) + call, tokens)
    state = GenerateState(args)
    state.submit_generate_tasks(groups)
    await reached(hold.reached, state)
    buffered = await abort(args, rollout_id)
    state.reset()
    return buffered
