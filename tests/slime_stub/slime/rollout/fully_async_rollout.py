"""Stand-in for slime.rollout.fully_async_rollout (--rollout-function-path
slime.rollout.fully_async_rollout.generate_rollout_fully_async, run by train_async.py), behaviour for behaviour:

- one process-wide AsyncRolloutWorker (a thread running its own asyncio loop), made at the first rollout with
  concurrency = sglang_server_concurrency x the number of engines, kept across rollouts so its queue stays warm;
- its loop, every poll_interval (1 s): reaps finished tasks, then tops up to `concurrency` groups in flight with
  data_buffer.get_samples(1), each run by generate_and_rm_group with a copy of GenerateState's sampling params,
  until `concurrency` finished groups wait in its output queue;
- a finished group holding an ABORTED sample goes back to the data buffer (add_samples) instead of the queue; it
  never calls abort() nor reads GenerateState.aborted: only the engines' answers abort an episode (a weight update
  pausing the engines);
- generate_rollout_fully_async takes rollout_batch_size finished groups off the queue (the rest stays queued for
  the next rollout), sorted by their first sample's index, and refuses evaluation.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading

from slime.rollout.sglang_rollout import GenerateState, generate_and_rm_group
from slime.utils.async_utils import run
from slime.utils.http_utils import get_rollout_num_engines
from slime.utils.types import Sample

__all__ = ["AsyncRolloutWorker", "generate_rollout_fully_async"]

logger = logging.getLogger("slime.rollout.fully_async")

_global_worker: AsyncRolloutWorker | None = None
_worker_lock = threading.Lock()


def _get_global_worker(args, data_buffer) -> AsyncRolloutWorker:
    global _global_worker
    with _worker_lock:
        if _global_worker is None or not _global_worker.worker_thread.is_alive():
            _global_worker = AsyncRolloutWorker(
                args, data_buffer, concurrency=args.sglang_server_concurrency * get_rollout_num_engines(args)
            )
            _global_worker.start()
        return _global_worker


def _stop_global_worker() -> None:
    global _global_worker
    with _worker_lock:
        if _global_worker is not None:
            _global_worker.stop()
            _global_worker = None


atexit.register(_stop_global_worker)


class AsyncRolloutWorker:
    """A background thread whose asyncio loop keeps `concurrency` groups in flight through generate_and_rm_group."""

    def __init__(self, args, data_buffer, concurrency: int = 10):
        self.args = args
        self.data_buffer = data_buffer
        self.concurrency = concurrency
        self.running = True
        self.output_queue: queue.Queue[tuple[int, list[Sample]]] = queue.Queue()  # unbounded, as in slime
        self.poll_interval = 1.0
        self.worker_thread: threading.Thread | None = None
        self.state = GenerateState(args)

    def start(self) -> None:
        if self.worker_thread is None or not self.worker_thread.is_alive():
            self.worker_thread = threading.Thread(target=self._thread_main, name="fully-async-rollout", daemon=True)
            self.worker_thread.start()

    def stop(self) -> None:
        self.running = False
        if self.worker_thread and self.worker_thread.is_alive():
            self.worker_thread.join(timeout=5)

    def get_completed_groups(self, limit: int | None = None) -> list[tuple[int, list[Sample]]]:
        completed: list[tuple[int, list[Sample]]] = []
        while limit is None or len(completed) < limit:
            try:
                completed.append(self.output_queue.get_nowait())
            except queue.Empty:
                break
        return completed

    def queue_size(self) -> int:
        return self.output_queue.qsize()

    def _thread_main(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        active_tasks: set[asyncio.Task] = set()
        gid_counter = 0
        while self.running:
            try:
                done = {t for t in active_tasks if t.done()}
                for t in done:
                    try:
                        t.result()
                    except Exception as e:  # noqa: BLE001
                        logger.warning("fully-async task crashed: %r", e)
                active_tasks -= done
                while (
                    len(active_tasks) < self.concurrency
                    and self.output_queue.qsize() < self.concurrency
                    and self.running
                ):
                    groups = self.data_buffer.get_samples(1)
                    if not groups:
                        break
                    for group in groups:
                        task = asyncio.create_task(
                            generate_and_rm_group(
                                self.args, group, sampling_params=self.state.sampling_params.copy(), evaluation=False
                            )
                        )
                        task.add_done_callback(self._make_done_cb(gid_counter))
                        gid_counter += 1
                        active_tasks.add(task)
                await asyncio.sleep(self.poll_interval)
            except Exception as e:  # noqa: BLE001
                logger.exception("fully-async loop iteration error: %s", e)
                await asyncio.sleep(self.poll_interval)
        if active_tasks:
            try:
                await asyncio.wait(active_tasks, timeout=30)
            except Exception:  # noqa: BLE001
                pass

    def _make_done_cb(self, gid: int):
        def _cb(done_task: asyncio.Task) -> None:
            try:
                result = done_task.result()
            except Exception:  # noqa: BLE001
                logger.exception("fully-async: process task raised")
                return
            if not isinstance(result, list):
                logger.warning("fully-async: generate_and_rm_group returned %r; dropping", type(result).__name__)
                return
            if any(getattr(s, "status", None) == Sample.Status.ABORTED for s in result):
                try:
                    self.data_buffer.add_samples([result])  # back to the buffer, to run again
                except Exception:  # noqa: BLE001
                    logger.exception("fully-async: failed to requeue aborted group")
                return
            self.output_queue.put((gid, result))

        return _cb


async def _generate_rollout_async(args, rollout_id: int, data_buffer) -> list[list[Sample]]:
    assert args.rollout_global_dataset
    worker = _get_global_worker(args, data_buffer)
    target = args.rollout_batch_size
    collected: dict[int, list[Sample]] = {}
    while len(collected) < target:
        drained = 0
        for gid, group in worker.get_completed_groups(limit=target - len(collected)):
            collected[gid] = group
            drained += 1
        if not drained:
            await asyncio.sleep(0.05)

    def _key(group: list[Sample]) -> int:
        for s in group:
            idx = getattr(s, "index", None)
            if idx is not None:
                return int(idx)
        return 0

    return sorted(collected.values(), key=_key)


def generate_rollout_fully_async(args, rollout_id, data_buffer, evaluation: bool = False):
    """slime's --rollout-function-path entry point."""
    if evaluation:
        raise ValueError("fully-async rollout doesn't support evaluation mode")
    return run(_generate_rollout_async(args, rollout_id, data_buffer))
