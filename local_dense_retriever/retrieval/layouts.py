"""Index layouts by name, and what each costs in memory: a FAISS factory string with its search parameters (on the
CPU), or exact search on GPUs (torch shards, or FAISS GPU's).

A layout spec is `FACTORY[:PARAMS]`: `Flat`, `HNSW32:efSearch=128`, `HNSW32,SQ8:efSearch=256`,
`IVF4096,SQ8:nprobe=64`, `IVF4096,PQ48:nprobe=128`; PARAMS is what faiss.ParameterSpace takes (the server's
--faiss_search_params), and for HNSW also efConstruction=N, the graph's build-time breadth (FAISS's default is 40;
`HNSW32:efConstruction=200,efSearch=256` builds a better graph for a longer build, see bench/RESULTS.md).
GPU layouts: `torch-fp16`, `torch-bf16`, `torch-fp32`, `faiss-gpu-fp16`, `faiss-gpu-fp32` (exact inner product, the
vectors split evenly over the GPUs).

The byte counts follow FAISS's own storage (faiss/IndexHNSW.cpp, IndexIVF*.cpp, IndexScalarQuantizer.cpp,
IndexPQ.cpp); tests/retriever/test_retriever_memory_plan.py checks them against written indexes.
"""

import math
import re
from dataclasses import dataclass

GPU_LAYOUTS = {"torch-fp16": 2, "torch-bf16": 2, "torch-fp32": 4, "faiss-gpu-fp16": 2, "faiss-gpu-fp32": 4}
# FAISS's StandardGpuResources keeps a temporary-memory pool per GPU: 1.5 GiB on GPUs with more than 4 GiB
# (faiss/gpu/StandardGpuResources.cpp, getDefaultTempMemForGPU).
FAISS_GPU_TEMP_BYTES = 3 << 29
SQ_BITS = {"SQ8": 8, "SQ6": 6, "SQ4": 4, "SQfp16": 16, "SQbf16": 16}
ACCEPTED = (
    "Flat, HNSW<M>[,Flat|,SQ8|,SQ6|,SQ4|,SQfp16|,PQ<m>], IVF<nlist>,(Flat|SQ8|SQ6|SQ4|SQfp16|PQ<m>[x<bits>]), "
    "each with optional :efSearch=N (HNSW, also efConstruction=N) or :nprobe=N (IVF); or a GPU layout: "
    + ", ".join(GPU_LAYOUTS)
)


@dataclass(frozen=True)
class Layout:
    factory: str  # faiss.index_factory string, or a GPU layout name
    params: str = ""  # faiss.ParameterSpace string, e.g. "efSearch=128": what the server searches with
    ef_construction: int | None = None  # HNSW's build-time breadth; None: FAISS's default (40)

    @property
    def spec(self) -> str:
        params = ",".join(filter(None, [self.build_params, self.params]))
        return f"{self.factory}:{params}" if params else self.factory

    @property
    def build_params(self) -> str:
        return f"efConstruction={self.ef_construction}" if self.ef_construction else ""

    @property
    def built_as(self) -> str:
        """What decides the index file: the factory and the build parameters (search parameters do not)."""
        return f"{self.factory}:{self.build_params}" if self.build_params else self.factory

    @property
    def on_gpu(self) -> bool:
        return self.factory in GPU_LAYOUTS

    @property
    def exact(self) -> bool:
        return self.factory == "Flat" or self.on_gpu

    def __str__(self) -> str:
        return self.spec


def file_part(text: str) -> str:
    """`HNSW32,SQ8:efConstruction=200` -> `HNSW32_SQ8_efConstruction200`: a layout in a file name."""
    return text.replace(",", "_").replace(":", "_").replace("=", "")


def parse_layout(spec: str) -> Layout:
    """A Layout from `FACTORY[:PARAMS]`; ValueError naming what is accepted."""
    factory, _, params = spec.strip().partition(":")
    factory = factory.strip()
    if factory.lower() in GPU_LAYOUTS:
        if params:
            raise ValueError(f"layout {spec!r}: GPU layouts take no search parameters")
        return Layout(factory.lower())
    if factory.lower() == "flat":
        factory = "Flat"
    if vector_bytes(factory, 768) is None:
        raise ValueError(f"layout {spec!r}: accepted are {ACCEPTED}")
    search, ef_construction = [], None
    for param in filter(None, (p.strip() for p in params.split(","))):
        name, _, value = param.partition("=")
        if name not in ("efSearch", "nprobe", "efConstruction") or not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"layout {spec!r}: parameters are efSearch=N and efConstruction=N (HNSW) or nprobe=N (IVF), N >= 1"
            )
        if (name != "nprobe") != factory.startswith("HNSW"):
            raise ValueError(f"layout {spec!r}: {name} does not apply to {factory}")
        if name == "efConstruction":
            ef_construction = int(value)
        else:
            search.append(param)
    return Layout(factory, ",".join(search), ef_construction)


def _code_bytes(codes: str, dim: int) -> float | None:
    """Bytes one vector's code takes: `Flat` (float32), `SQ8`, `SQfp16`, `PQ48`, `PQ48x4`, ..."""
    if codes in ("", "Flat"):
        return 4.0 * dim
    if codes in SQ_BITS:
        return math.ceil(dim * SQ_BITS[codes] / 8)
    match = re.fullmatch(r"PQ(\d+)(?:x(\d+))?", codes)
    if match:
        m, bits = int(match[1]), int(match[2] or 8)
        return math.ceil(m * bits / 8) if dim % m == 0 else None
    return None


def vector_bytes(factory: str, dim: int) -> float | None:
    """Bytes per indexed vector (codes, ids, graph links) of a factory string; None when not modelled."""
    match = re.fullmatch(r"HNSW(\d+)(?:,(\w+))?", factory)
    if match:
        m, codes = int(match[1]), _code_bytes(match[2] or "Flat", dim)
        if codes is None or m < 2:
            return None
        # Level 0 keeps 2M int32 links, each level above M more; a vector reaches level l with probability M^-l,
        # so about one more link on average. Plus its offset (int64) and level (int32).
        return codes + 4 * (2 * m + m / (m - 1)) + 12
    match = re.fullmatch(r"IVF(\d+),(\w+)", factory)
    if match:
        codes = _code_bytes(match[2], dim)
        return None if codes is None else codes + 8  # + its id (int64) in the inverted list
    if factory == "Flat":
        return 4.0 * dim
    return None


def fixed_bytes(factory: str, dim: int) -> int:
    """Bytes that do not grow with the corpus: IVF centroids, PQ codebooks, scalar quantizer ranges."""
    total = 0
    match = re.match(r"IVF(\d+),", factory)
    if match:
        total += int(match[1]) * dim * 4
    match = re.search(r"PQ(\d+)(?:x(\d+))?$", factory)
    if match:
        total += (1 << int(match[2] or 8)) * dim * 4
    if re.search(r"SQ\w+$", factory):
        total += 2 * dim * 4
    return total


def index_bytes(factory: str, size: int, dim: int) -> int | None:
    """Bytes a CPU index of `size` vectors takes in memory (as on disk); None when not modelled."""
    per_vector = vector_bytes(factory, dim)
    return None if per_vector is None else int(per_vector * size) + fixed_bytes(factory, dim)


def gpu_shard_bytes(layout: Layout, size: int, dim: int, gpus: int) -> int:
    """Vector bytes on each GPU of an exact GPU layout (the largest shard)."""
    return math.ceil(size / gpus) * dim * GPU_LAYOUTS[layout.factory]


def default_nlist(size: int) -> int:
    """IVF lists: about 4 sqrt(size), a power of two, at least 1 and at most size / 39 (FAISS wants 39 training
    points per centroid)."""
    nlist = 1 << max(0, round(math.log2(max(1.0, 4 * math.sqrt(size)))))
    while nlist > 1 and nlist * 39 > size:
        nlist //= 2
    return nlist


def default_pq(dim: int) -> int:
    """PQ sub-quantizers: dim / 4 bytes per vector (8-bit codes of 4 dimensions each), the nearest divisor of dim."""
    target = max(1, dim // 4)
    return min((m for m in range(1, dim + 1) if dim % m == 0), key=lambda m: (abs(m - target), -m))
