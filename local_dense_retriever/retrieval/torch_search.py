"""Exact inner-product search with torch alone: the vectors split in row shards over the devices named (GPUs, or
the CPU), in fp16, bf16 or fp32; each shard scans its rows in chunks that bound the score workspace, keeps its
top-k, and the shards' top-k are merged. No FAISS GPU wheel (and its CUDA version) to match: the retriever's
environment already has torch. Rows and scores equal FAISS Flat's (ties aside; scores within the dtype's
rounding), tests/retriever/test_retriever_torch_search.py checks it.
"""

import logging
import math
from collections.abc import Sequence

import numpy as np
import torch

from local_dense_retriever.retrieval.gpus import parse_gpu_list
from local_dense_retriever.retrieval.index_files import FlatVectors

logger = logging.getLogger(__name__)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_WORKSPACE_MB = {"cuda": 1024, "cpu": 256}  # score matrix per chunk (queries x rows x score bytes)
LOAD_CHUNK_ROWS = 1 << 18  # rows copied from the memory-mapped file to a device at a time


def parse_devices(value: str, flag: str = "--torch_search") -> list[torch.device]:
    """`cpu`, `all` (every GPU torch sees) or GPU ids `0,1,3`; ValueError naming what is accepted."""
    ids = parse_gpu_list(flag, value, torch.cuda.device_count())
    return [torch.device("cpu")] if ids is None else [torch.device("cuda", i) for i in ids]


def default_dtype(devices: Sequence[torch.device]) -> str:
    # fp16 halves GPU memory and doubles matmul speed; CPUs without fp16 kernels are ~4x slower in it than fp32.
    return "fp16" if devices[0].type == "cuda" else "fp32"


class TorchExactIndex:
    """A VectorIndex (size, dim, description, search_vectors) over row shards of the vectors, one per device."""

    def __init__(
        self,
        vectors: FlatVectors | np.ndarray,
        devices: Sequence[torch.device],
        dtype: str | None = None,
        workspace_mb: float | None = None,
        progress: bool = False,
    ):
        from tqdm import tqdm

        source = vectors.array if isinstance(vectors, FlatVectors) else vectors
        if isinstance(vectors, FlatVectors) and vectors.metric != "ip":
            raise ValueError(f"{vectors.path}: torch search is inner product; this Flat index is {vectors.metric}")
        self.devices = list(devices)
        self.dtype_name = dtype or default_dtype(self.devices)
        self.dtype = DTYPES[self.dtype_name]
        self.size, self.dim = int(source.shape[0]), int(source.shape[1])
        kind = self.devices[0].type
        self.workspace_bytes = int((workspace_mb or DEFAULT_WORKSPACE_MB[kind]) * 2**20)
        per_shard = math.ceil(self.size / len(self.devices)) if self.size else 0
        check_room(self.devices, per_shard * self.dim * self.dtype.itemsize, self.workspace_bytes)
        self.starts = [min(self.size, i * per_shard) for i in range(len(self.devices) + 1)]
        self.shards: list[torch.Tensor] = []
        with tqdm(total=self.size, unit="vec", desc=f"vectors to {kind}", disable=not progress) as bar:
            for device, start, stop in zip(self.devices, self.starts, self.starts[1:], strict=False):
                shard = torch.empty((stop - start, self.dim), dtype=self.dtype, device=device)
                for first in range(start, stop, LOAD_CHUNK_ROWS):  # streamed: no full copy in host memory
                    last = min(stop, first + LOAD_CHUNK_ROWS)
                    rows = torch.from_numpy(np.array(source[first:last], dtype=np.float32))  # a chunk-sized copy
                    shard[first - start : last - start] = rows.to(device=device, dtype=self.dtype)
                    bar.update(last - first)
                self.shards.append(shard)
        where = "CPU" if kind == "cpu" else f"GPU(s) {','.join(str(d.index) for d in self.devices)}"
        self.description = f"torch exact inner product ({self.size} x {self.dim}, {self.dtype_name}) on {where}"

    @classmethod
    def from_shards(cls, shards: Sequence[torch.Tensor]) -> "TorchExactIndex":
        """An index over tensors already on their devices (benchmarks that generate vectors on the GPU)."""
        index = cls.__new__(cls)
        index.shards, index.devices = list(shards), [shard.device for shard in shards]
        index.dtype = shards[0].dtype
        index.dtype_name = {v: k for k, v in DTYPES.items()}[index.dtype]
        index.size, index.dim = sum(len(shard) for shard in shards), int(shards[0].shape[1])
        index.starts = [0]
        for shard in shards:
            index.starts.append(index.starts[-1] + len(shard))
        index.workspace_bytes = int(DEFAULT_WORKSPACE_MB[index.devices[0].type] * 2**20)
        index.description = f"torch exact inner product ({index.size} x {index.dim}, {index.dtype_name})"
        return index

    def shard_bytes(self) -> list[int]:
        return [shard.numel() * shard.element_size() for shard in self.shards]

    def chunk_rows(self, queries: int) -> int:
        """Rows scored at a time so that the queries x rows score matrix stays within the workspace."""
        score_bytes = 4 if self.dtype == torch.float32 else 2
        return max(1024, self.workspace_bytes // max(1, queries * score_bytes))

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
        n = len(queries)
        partial_scores, partial_rows = [], []
        with torch.inference_mode():
            # Every shard's work is queued before any result is read, so GPUs scan their shards at the same time.
            for device, start, shard in zip(self.devices, self.starts, self.shards, strict=False):
                if len(shard) == 0:
                    continue
                q = queries.to(device=device, dtype=self.dtype, non_blocking=True)
                scores, rows = _shard_topk(q, shard, k, self.chunk_rows(n))
                partial_scores.append(scores.float())
                partial_rows.append(rows + start)
            scores = torch.cat([s.cpu() for s in partial_scores], dim=1) if partial_scores else torch.empty(n, 0)
            rows = torch.cat([r.cpu() for r in partial_rows], dim=1) if partial_rows else torch.empty(n, 0).long()
            found = min(k, scores.shape[1])
            scores, order = scores.topk(found, dim=1)
            rows = rows.gather(1, order)
        out_scores = np.full((n, k), -np.inf, dtype=np.float32)  # FAISS pads with -1 rows when k > size
        out_rows = np.full((n, k), -1, dtype=np.int64)
        out_scores[:, :found], out_rows[:, :found] = scores.numpy(), rows.numpy()
        return out_scores, out_rows


def check_room(devices: Sequence[torch.device], shard_bytes: int, workspace_bytes: int) -> None:
    """Refuse, before copying anything, shards that the devices' free memory cannot hold (with the workspace)."""
    from local_dense_retriever.retrieval.memory_plan import available_ram, gib

    needed = shard_bytes + workspace_bytes
    for device in devices:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            where = f"GPU {device.index} has {gib(free)} free"
        else:
            free = available_ram() * 0.9  # leave the encoder and the corpus some room
            where = f"this machine has {gib(free)} of RAM available"
        if needed > free:
            raise ValueError(
                f"--torch_search: {where} but a shard of {len(devices)} needs {gib(shard_bytes)} + "
                f"{gib(workspace_bytes)} workspace; accepted: more GPUs, fp16/bf16 (--torch_search_dtype), or a "
                "smaller --search_workspace_mb"
            )


def _shard_topk(queries: torch.Tensor, shard: torch.Tensor, k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of queries @ shard.T, chunk rows at a time: the running best k merged with each chunk's best k."""
    best_scores = best_rows = None
    for first in range(0, len(shard), chunk):
        scores = queries @ shard[first : first + chunk].T
        top_scores, top_rows = scores.topk(min(k, scores.shape[1]), dim=1)
        del scores  # freed before the next chunk's matrix is allocated: one workspace at a time, not two
        top_rows += first
        if best_scores is None:
            best_scores, best_rows = top_scores, top_rows
            continue
        merged_scores = torch.cat([best_scores, top_scores], dim=1)
        merged_rows = torch.cat([best_rows, top_rows], dim=1)
        best_scores, order = merged_scores.topk(min(k, merged_scores.shape[1]), dim=1)
        best_rows = merged_rows.gather(1, order)
    return best_scores, best_rows


def streamed_topk(
    queries: np.ndarray, vectors: FlatVectors, k: int, chunk_rows: int = 1 << 16, progress: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k of `queries` over memory-mapped vectors, read chunk by chunk in fp32 (no copy of
    the whole file in RAM): the Flat answers the tuner measures recall against."""
    from tqdm import tqdm

    if vectors.metric != "ip":
        raise ValueError(f"{vectors.path}: exact answers are computed for inner-product indexes; this one is l2")
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    best_scores = best_rows = None
    with torch.inference_mode(), tqdm(total=vectors.size, unit="vec", desc="exact top-k", disable=not progress) as bar:
        for first, chunk in vectors.chunks(chunk_rows):
            scores, rows = _shard_topk(q, torch.from_numpy(chunk), k, len(chunk))
            rows += first
            if best_scores is not None:
                scores, rows = torch.cat([best_scores, scores], 1), torch.cat([best_rows, rows], 1)
                scores, order = scores.topk(min(k, scores.shape[1]), dim=1)
                rows = rows.gather(1, order)
            best_scores, best_rows = scores, rows
            bar.update(len(chunk))
    return best_scores.numpy(), best_rows.numpy()
