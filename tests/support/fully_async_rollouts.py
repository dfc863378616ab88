"""slime's fully-async rollout (generate_rollout_fully_async), driven as train_async.py drives it: slime's own
AsyncRolloutWorker and data buffer (SLIME_SRC; the stand-in's otherwise) over the test's prompts, read once."""

import asyncio
import contextlib
import logging

from slime.rollout import fully_async_rollout
from slime.rollout.data_source import RolloutDataSource, RolloutDataSourceWithBuffer
from slime.rollout.fully_async_rollout import AsyncRolloutWorker, generate_rollout_fully_async
from slime.utils.http_utils import get_rollout_num_engines
from slime.utils.types import Sample


class Prompts:
    """What slime's get_samples reads of its Dataset: `samples`, and a length."""

    def __init__(self, samples: list[Sample]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)


class PromptsOnce(RolloutDataSourceWithBuffer):
    """slime's data buffer (groups put back first, then new prompts, as slime makes them) over prompts read once:
    where slime would start a second epoch the worker finds nothing more to start, so the engine serves the test's
    episodes only."""

    def __init__(self, args, prompts: list[Sample]):
        super().__init__(args)
        self.dataset = Prompts(prompts)

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = self._get_samples_from_buffer(num_samples)
        fresh = min(num_samples - len(groups), len(self.dataset) - self.sample_offset)
        return groups + (RolloutDataSource.get_samples(self, fresh) if fresh > 0 else [])


class Crashes(logging.Handler):
    """slime's worker logs a group whose task raised and drops it, so its rollout would wait for it forever: the
    first such record fills the worker's queue with empty groups (the rollout returns) and fails the test."""

    def __init__(self, worker):
        super().__init__(logging.WARNING)
        self.worker, self.messages = worker, []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(self.format(record))
        for gid in range(-self.worker.args.rollout_batch_size, 0):
            self.worker.output_queue.put((gid, [Sample()]))


@contextlib.contextmanager
def fully_async_worker(args, buffer):
    """slime's process-wide worker, made as its first rollout makes it, but looking at its buffer every 10 ms rather
    than every second (a group put back waits one look)."""
    worker = AsyncRolloutWorker(
        args, buffer, concurrency=args.sglang_server_concurrency * get_rollout_num_engines(args)
    )
    worker.poll_interval = 0.01
    crashes = Crashes(worker)
    crashes.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger(fully_async_rollout.logger.name).addHandler(crashes)
    fully_async_rollout._global_worker = worker
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
        fully_async_rollout._global_worker = None
        logging.getLogger(fully_async_rollout.logger.name).removeHandler(crashes)
    assert not crashes.messages, f"slime's worker dropped a group: {crashes.messages}"


async def fully_async_rollout_of(args, prompts: list[Sample]) -> list[list[Sample]]:
    """One rollout of slime's fully-async function (rollout_batch_size groups) over `prompts`."""
    buffer = PromptsOnce(args, prompts)
    with fully_async_worker(args, buffer):
        return await asyncio.to_thread(generate_rollout_fully_async, args, 0, buffer)
