"""Text encoders for dense retrieval: E5, BGE, DPR and any Hugging Face encoder, on CPU or GPU.

One `TextEncoder` must be used from one thread at a time: a fast (Rust) tokenizer shared across threads has
returned wrong token ids here. `fork()` gives another thread an encoder of its own that shares the model's weights.
"""

import copy
import logging
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from local_dense_retriever.retrieval.query_reader import QueryReader

logger = logging.getLogger(__name__)

POOLING_METHODS = ("mean", "cls", "pooler")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PRECISIONS = (*DTYPES, "int8")  # int8: fp32 weights with dynamically quantised Linear layers, CPU only
BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
EXACT_SPLIT_MAX_ROWS = 1024  # above this (index building), a greedy split; below (query batches), the optimal one


@dataclass(frozen=True)
class EncoderFamily:
    """How a model family expects its inputs and outputs (from each model card / Search-R1's server)."""

    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: str = "mean"
    normalize: bool = True


def encoder_family(retriever_name: str) -> EncoderFamily:
    name = retriever_name.lower()
    if "e5" in name:
        return EncoderFamily(query_prefix="query: ", passage_prefix="passage: ", pooling="mean")
    if "bge" in name:
        return EncoderFamily(query_prefix=BGE_QUERY_INSTRUCTION, pooling="cls")
    if "dpr" in name:
        # DPR is trained with raw inner products on the pooler output; normalising would change the ranking.
        return EncoderFamily(pooling="pooler", normalize=False)
    return EncoderFamily()


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device} was requested but torch sees no CUDA device")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The dtype the weights are loaded in. fp16 halves GPU time, but on CPU it is ~4x slower than fp32 for batches
    (no fast fp16 kernels there); on CPU, bf16 and int8 are chosen by measurement with --dtype measured (precision.py),
    which starts in fp32."""
    if dtype in ("auto", "measured"):
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype == "int8":
        if device.type != "cpu":
            raise ValueError("--dtype int8 (dynamic quantisation) runs on the CPU; accepted on GPU: fp16, bf16, fp32")
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: accepted are auto, {', '.join(PRECISIONS)}")
    return DTYPES[dtype]


def encoder_from_config(config, **extra) -> "TextEncoder":
    """A TextEncoder from a server or builder config (both name the encoder settings alike)."""
    return TextEncoder(
        config.retriever_model,
        retriever_name=config.retriever_name,
        pooling=config.pooling_method,
        max_length=config.max_length,
        device=config.device,
        dtype=config.dtype,
        **extra,
    )


class TextEncoder:
    """Encode queries or passages into float32 vectors, in length-sorted micro-batches."""

    def __init__(
        self,
        model_path: str,
        retriever_name: str = "e5",
        pooling: str = "auto",
        max_length: int = 256,
        device: str = "auto",
        dtype: str = "auto",
        max_tokens_per_forward: int | None = None,
        max_rows_per_forward: int | None = None,
        multi_gpu: bool = False,
        trace: bool = True,
    ):
        from transformers import AutoModel, AutoTokenizer

        self.family = encoder_family(retriever_name)
        self.pooling = self.family.pooling if pooling == "auto" else pooling
        if self.pooling not in POOLING_METHODS:
            raise ValueError(f"pooling must be one of auto, {', '.join(POOLING_METHODS)}; got {pooling!r}")
        self.max_length = max_length
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.precision = "int8" if dtype == "int8" else {v: k for k, v in DTYPES.items()}[self.dtype]
        # Padding is wasted work: sort by length and cap each forward pass at a token budget instead of a row count.
        self.max_tokens_per_forward = max_tokens_per_forward or (65536 if self.device.type == "cuda" else 4096)
        self.max_rows_per_forward = max_rows_per_forward or 1 << 30
        # Fixed cost of one forward pass in token-equivalents (measured on CPU: ~8 ms vs ~0.25 ms per token).
        self.forward_overhead_tokens = 2048 if self.device.type == "cuda" else 32

        self.tokenizer = AutoTokenizer.from_pretrained(model_path, use_fast=True)
        model = AutoModel.from_pretrained(model_path, dtype=self.dtype)
        model.eval().to(self.device)
        if self.precision == "int8":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
                model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        self.model = model
        self._forward = model
        if multi_gpu and self.device.type == "cuda" and torch.cuda.device_count() > 1:
            # Index building only: splitting each batch over GPUs pays off for big batches, not for queries.
            self._forward = torch.nn.DataParallel(model)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # The vector size is whatever the pooling yields (hidden size, or a projection for some models).
        with torch.inference_mode():
            self.dim = int(self._embed(*self._pad([self.tokenizer("probe")["input_ids"]])).shape[1])
        self.traced = trace and self.device.type == "cpu" and self._trace()

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self.encode([self.family.query_prefix + text for text in texts])

    def query_reader(self) -> QueryReader:
        """How far this encoder reads each query and how many tokens it encodes it at, for another thread."""
        return QueryReader(self.tokenizer, self.max_length, self.family.query_prefix)

    def encode_passages(self, texts: list[str], **options) -> np.ndarray:
        """`options`: encode()'s `on_batch` and `run`."""
        return self.encode([self.family.passage_prefix + text for text in texts], **options)

    def _trace(self) -> bool:
        """Run the model as one TorchScript graph on the CPU; True when that is what it does now.

        Why: an eager forward pass takes and drops the GIL at each of its ~100 operators, so worker threads queue
        for it behind each other and behind the server's event loop. Measured in-process (10k, batches of 64, two
        single-threaded workers): 620 -> 669 queries/s, and beside a Python thread holding the GIL 16% of the time
        (as the event loop does at 500 requests/s) 514 -> 616. Kept only if the graph gives the model's vectors on
        a batch of another size and length than the one it was traced with (a model whose code bakes shapes into
        the trace fails that); any failure leaves the model as it is.
        """
        probe = [self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"]
                 for text in ("probe " * self.max_length, "probe", "a probe of the trace")]  # fmt: skip
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecation and TracerWarnings: the check below decides
                graph = torch.jit.trace(self.model, self._pad(probe[1:]), strict=False, check_trace=False)
                traced = _TracedForward(graph)
                expected, got = self._embed(*self._pad(probe)), self._embed(*self._pad(probe), forward=traced)
        except Exception as err:  # anything the tracer or an odd model raises: keep it eager
            logger.info("encoder kept eager: tracing failed (%s: %s)", type(err).__name__, err)
            return False
        if not np.allclose(expected, got, atol=1e-5):
            logger.info("encoder kept eager: the traced graph differs from the model on another shape")
            return False
        self._forward = traced
        return True

    def fork(self) -> "TextEncoder":
        """The same encoder for another thread: the weights are shared (inference only reads them), the tokenizer is
        a copy."""
        twin = copy.copy(self)
        twin.tokenizer = copy.deepcopy(self.tokenizer)
        return twin

    def encode(
        self,
        texts: list[str],
        on_batch: Callable[[int], object] | None = None,
        run: Callable[[Callable, list[np.ndarray]], Iterable] = map,
    ) -> np.ndarray:
        """Vectors in input order; `on_batch(n)` is called after each forward pass (progress bars). `run(forward,
        passes)` runs the forward passes and yields their results in any order (the index builder runs them on
        several threads); texts are tokenized once, here, on the calling thread."""
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        token_ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]

        def forward(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with torch.inference_mode():  # per thread in torch, so here and not on encode()
                return rows, self._embed(*self._pad([token_ids[row] for row in rows]))

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for rows, vectors in run(forward, self._micro_batches([len(ids) for ids in token_ids])):
            out[rows] = vectors
            if on_batch is not None:
                on_batch(len(rows))
        return out

    def _micro_batches(self, lengths: list[int]) -> list[np.ndarray]:
        """Split rows, sorted by length, into forward passes: few passes, little padding, within the caps."""
        order = np.argsort(lengths, kind="stable")
        if len(order) > EXACT_SPLIT_MAX_ROWS:
            return self._greedy_split(order, np.asarray(lengths)[order])
        return self._cheapest_split(order, np.asarray(lengths)[order])

    def _greedy_split(self, order: np.ndarray, sorted_lengths: np.ndarray) -> list[np.ndarray]:
        # Thousands of sorted passages: neighbours have nearly equal lengths, so filling up to the caps wastes little.
        batches, start = [], 0
        for end in range(1, len(order) + 1):
            if (
                end == len(order)
                or end - start >= self.max_rows_per_forward
                or (end + 1 - start) * sorted_lengths[end] > self.max_tokens_per_forward
            ):
                batches.append(order[start:end])
                start = end
        return batches

    def _cheapest_split(self, order: np.ndarray, sorted_lengths: np.ndarray) -> list[np.ndarray]:
        """Optimal split of a query batch under cost = forward overhead + padded tokens, by dynamic programming.

        Queries are short and uneven (6-54 tokens here): one pass pads all 64 to the longest and does ~2x the
        work, while one pass per query pays the per-pass overhead 64 times.
        """
        n = len(order)
        best = np.zeros(n + 1)  # best[j]: cheapest way to encode the j shortest rows
        start_of = np.zeros(n + 1, dtype=np.int64)
        for j in range(1, n + 1):
            starts = np.arange(j)
            rows = j - starts
            cost = best[:j] + self.forward_overhead_tokens + rows * sorted_lengths[j - 1]
            too_big = (rows > self.max_rows_per_forward) | (rows * sorted_lengths[j - 1] > self.max_tokens_per_forward)
            too_big[j - 1] = False  # a single row is always allowed
            cost[too_big] = np.inf
            start_of[j] = int(np.argmin(cost))
            best[j] = cost[start_of[j]]
        batches, end = [], n
        while end > 0:
            batches.append(order[start_of[end] : end])
            end = start_of[end]
        return batches[::-1]

    def _pad(self, token_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(ids) for ids in token_ids)
        input_ids = np.full((len(token_ids), width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(token_ids), width), dtype=np.int64)
        for row, ids in enumerate(token_ids):
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
        return torch.from_numpy(input_ids), torch.from_numpy(attention_mask)

    def _embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, forward=None) -> np.ndarray:
        input_ids = input_ids.to(self.device, non_blocking=True)
        attention_mask = attention_mask.to(self.device, non_blocking=True)
        output = (forward or self._forward)(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        if self.pooling == "pooler":
            pooled = output.pooler_output
        elif self.pooling == "cls":
            pooled = output.last_hidden_state[:, 0]
        else:
            hidden = output.last_hidden_state.float()
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        pooled = pooled.float()
        if self.family.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy()


class _TracedForward:
    """A traced model called as the model is (keyword tensors in, an object with the output fields out)."""

    def __init__(self, graph: torch.jit.ScriptModule):
        self.graph = graph

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, return_dict: bool = True):
        output = self.graph(input_ids, attention_mask)
        if not isinstance(output, dict):
            raise TypeError(f"the traced model returned {type(output).__name__}, not the model's named outputs")
        return SimpleNamespace(**output)
