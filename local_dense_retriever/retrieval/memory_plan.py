"""What a retriever layout costs in host RAM and on each GPU, and whether it fits beside training, before any GPU
is spent:

    python -m local_dense_retriever.memory_plan --corpus_size 21000000 --dim 768 --layout torch-fp16 --gpus 8 \
        --gpu_gib 80 --sglang_mem_fraction_static 0.7 --trainer_gib 6
    python -m local_dense_retriever.memory_plan --corpus_size 21000000 --dim 768 --table   # docs/retriever.md's table

`plan_and_check()` returns the plan, or raises MemoryPlanError with one line that holds the figures; the launch side
(slime_search_r1/launch/retriever_memory.py) uses plan_memory, TrainingBudget and check_fits per GPU. Beside
colocated training a GPU gives the retriever what SGLang's static memory fraction and the trainer leave:
total x (1 - fraction) - trainer - reserve (CUDA contexts, allocator slack).
"""

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from local_dense_retriever.retrieval.layouts import (
    FAISS_GPU_TEMP_BYTES,
    GPU_LAYOUTS,
    Layout,
    default_nlist,
    default_pq,
    gpu_shard_bytes,
    index_bytes,
    parse_layout,
)

GIB = 2**30
E5_BASE_PARAMETERS = 109_500_000  # intfloat/e5-base-v2, the Search-R1 encoder
CUDA_CONTEXT_BYTES = 600 * 2**20  # a torch process's CUDA context and kernels on one GPU (H100, CUDA 12)
TORCH_WORKSPACE_BYTES = GIB  # torch_search's default score workspace on a GPU
TORCH_LOAD_CHUNK_BYTES = (1 << 18) * 4  # per dimension: rows streamed from the file to a GPU at a time (fp32)
DEFAULT_RESERVE_GIB = 1.0
# What slime's colocated trainer keeps on each GPU while SGLang generates (what the launch checks count): slime's
# v0.1.0 release notes (docs/en/blogs/release_v0.1.0.md) measured Megatron's residual GPU memory after offloading at
# 3-5 GB (NCCL buffers and CUDA contexts once torch_memory_saver paused its tensors); 6 GiB keeps a margin above it.
COLOCATED_TRAINER_GIB = 6.0


class MemoryPlanError(ValueError):
    """The layout does not fit; the message names the setting, the figures and what would fit."""


@dataclass
class MemoryPlan:
    layout: str
    corpus_size: int
    dim: int
    gpus: int
    ram_bytes: int  # host memory the server needs (peak, while loading)
    ram_note: str
    gpu_bytes: int  # on the most loaded GPU (the first: it also holds the encoder); 0 for CPU layouts
    gpu_parts: dict = field(default_factory=dict)  # what gpu_bytes is made of

    def describe(self) -> str:
        text = f"layout {self.layout}, {self.corpus_size:,} x {self.dim}: RAM {gib(self.ram_bytes)} ({self.ram_note})"
        if self.gpus:
            parts = " + ".join(f"{name} {gib(value)}" for name, value in self.gpu_parts.items())
            text += f"; per GPU over {self.gpus}: {gib(self.gpu_bytes)} ({parts})"
        return text


@dataclass(frozen=True)
class TrainingBudget:
    """What training declares on each GPU the retriever would share."""

    gpu_total_bytes: int
    sglang_mem_fraction_static: float = 0.0  # SGLang's --mem-fraction-static (slime: --sglang-mem-fraction-static)
    trainer_bytes: int = 0  # what the colocated trainer keeps on the GPU while SGLang holds its share
    reserve_bytes: int = int(DEFAULT_RESERVE_GIB * GIB)

    @property
    def available_bytes(self) -> int:
        left = int(self.gpu_total_bytes * (1 - self.sglang_mem_fraction_static))
        return left - self.trainer_bytes - self.reserve_bytes

    def describe(self) -> str:
        return (
            f"{gib(self.gpu_total_bytes)} x (1 - {self.sglang_mem_fraction_static:g} SGLang static fraction) "
            f"- {gib(self.trainer_bytes)} trainer - {gib(self.reserve_bytes)} reserve = {gib(self.available_bytes)}"
        )


def gib(value: float) -> str:
    """Bytes for a message: GiB, or MiB below a tenth of one (small test indexes)."""
    return f"{value / GIB:.1f} GiB" if abs(value) >= GIB / 10 else f"{value / 2**20:.1f} MiB"


def plan_memory(
    layout: Layout | str,
    corpus_size: int,
    dim: int,
    gpus: int = 0,
    encoder_parameters: int = E5_BASE_PARAMETERS,
    mmap: bool = False,
) -> MemoryPlan:
    """RAM and per-GPU bytes of serving `corpus_size` x `dim` vectors in `layout` (GPU layouts over `gpus` GPUs;
    the encoder in fp16 on the first GPU; CPU layouts with the encoder in fp32 in RAM)."""
    layout = parse_layout(layout) if isinstance(layout, str) else layout
    if not layout.on_gpu:
        if gpus:
            raise MemoryPlanError(f"--layout {layout}: a CPU layout uses no GPU; accepted for --gpus: 0")
        index = index_bytes(layout.factory, corpus_size, dim)
        encoder = encoder_parameters * 4
        if mmap and layout.factory == "Flat":
            note = f"memory-mapped: pages of the {gib(index)} file are cached while RAM allows; encoder {gib(encoder)}"
            return MemoryPlan(layout.spec, corpus_size, dim, 0, encoder, note, 0)
        return MemoryPlan(layout.spec, corpus_size, dim, 0, index + encoder, f"index {gib(index)} + encoder", 0)
    if gpus < 1:
        raise MemoryPlanError(f"--layout {layout} needs GPUs; accepted for --gpus: 1 or more")
    shard = gpu_shard_bytes(layout, corpus_size, dim, gpus)
    torch_layout = layout.factory.startswith("torch")
    parts = {
        "vectors": shard,
        "workspace": TORCH_WORKSPACE_BYTES if torch_layout else FAISS_GPU_TEMP_BYTES,
        "encoder": encoder_parameters * 2,
        "CUDA context": CUDA_CONTEXT_BYTES,
    }
    if torch_layout:  # streamed from the memory-mapped Flat file, a chunk at a time
        ram, note = TORCH_LOAD_CHUNK_BYTES * dim, "a load chunk: vectors stream from the memory-mapped file"
    else:  # FAISS reads the whole CPU index before cloning it to the GPUs
        ram = index_bytes("Flat", corpus_size, dim)
        note = "FAISS reads the whole Flat index into RAM before cloning it to the GPUs"
    return MemoryPlan(layout.spec, corpus_size, dim, gpus, ram, note, sum(parts.values()), parts)


def check_fits(plan: MemoryPlan, budget: TrainingBudget | None = None, ram_available: int | None = None) -> None:
    """MemoryPlanError (one line with the figures) when the plan does not fit the GPUs beside training, or RAM."""
    if plan.gpus and budget is not None and plan.gpu_bytes > budget.available_bytes:
        fitting = [g for g in (1, 2, 4, 8, 16, 32, 64) if _gpu_bytes(plan, g) <= budget.available_bytes]
        hint = f"{fitting[0]} or more GPUs" if fitting else "a CPU layout (HNSW or IVF, see the tuner)"
        raise MemoryPlanError(
            f"--layout {plan.layout} over {plan.gpus} GPU(s) needs {gib(plan.gpu_bytes)} per GPU but beside training "
            f"each has {budget.describe()}; accepted: {hint}, a lower SGLang fraction, or a CPU layout"
        )
    if ram_available is not None and plan.ram_bytes > ram_available:
        raise MemoryPlanError(
            f"--layout {plan.layout} needs {gib(plan.ram_bytes)} of RAM ({plan.ram_note}) but {gib(ram_available)} is "
            "available; accepted: a smaller layout (SQ8 or PQ codes, see the tuner), --faiss_mmap for Flat, or GPUs"
        )


def _gpu_bytes(plan: MemoryPlan, gpus: int) -> int:
    return plan_memory(plan.layout, plan.corpus_size, plan.dim, gpus).gpu_bytes


def plan_and_check(
    layout: str,
    corpus_size: int,
    dim: int,
    gpus: int = 0,
    gpu_total_bytes: int | None = None,
    sglang_mem_fraction_static: float = 0.0,
    trainer_bytes: int = 0,
    ram_available: int | None = None,
    mmap: bool = False,
) -> MemoryPlan:
    """The plan for one layout, checked against the GPUs beside training (when `gpu_total_bytes` is given) and RAM
    (when `ram_available` is given). Raises MemoryPlanError with the figures."""
    if not 0 <= sglang_mem_fraction_static < 1:
        raise MemoryPlanError(
            f"--sglang_mem_fraction_static {sglang_mem_fraction_static}: accepted is a fraction in [0, 1)"
        )
    plan = plan_memory(layout, corpus_size, dim, gpus, mmap=mmap)
    budget = None
    if gpu_total_bytes is not None:
        budget = TrainingBudget(gpu_total_bytes, sglang_mem_fraction_static, trainer_bytes)
    check_fits(plan, budget, ram_available)
    return plan


def available_ram() -> int:
    """Memory this process could still take: MemAvailable, capped by its cgroup's limit."""
    import psutil

    available = psutil.virtual_memory().available
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            usage_file = Path(path).with_name("memory.current" if path.endswith(".max") else "memory.usage_in_bytes")
            try:
                used = int(usage_file.read_text())
            except (OSError, ValueError):
                used = 0
            available = min(available, int(limit) - used)
        break
    return available


def table_layouts(corpus_size: int, dim: int) -> list[str]:
    nlist, pq = default_nlist(corpus_size), default_pq(dim)
    cpu = ["Flat", "HNSW32", "HNSW32,SQ8", f"IVF{nlist},Flat", f"IVF{nlist},SQ8", f"IVF{nlist},PQ{pq}"]
    return cpu + list(GPU_LAYOUTS)


def markdown_table(corpus_size: int, dim: int, gpu_counts: tuple[int, ...] = (1, 2, 4, 8)) -> str:
    lines = [
        f"| layout ({corpus_size:,} x {dim}) | RAM | " + " | ".join(f"per GPU, {g} GPU(s)" for g in gpu_counts) + " |",
        "|---|---|" + "---|" * len(gpu_counts),
    ]
    for spec in table_layouts(corpus_size, dim):
        layout = parse_layout(spec)
        if layout.on_gpu:
            plans = [plan_memory(layout, corpus_size, dim, g) for g in gpu_counts]
            ram = gib(plans[0].ram_bytes)
            cells = [gib(p.gpu_bytes) for p in plans]
        else:
            ram = gib(plan_memory(layout, corpus_size, dim).ram_bytes)
            cells = ["-"] * len(gpu_counts)
        lines.append(f"| {spec} | {ram} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="RAM and per-GPU memory of a retriever layout, checked against what training leaves free.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--corpus_size", type=int, help="passages (wiki-18: 21015324)")
    size.add_argument("--index_path", help="read the size and dimension from this FAISS index's header")
    parser.add_argument("--dim", type=int, default=768, help="vector dimension (e5-base-v2: 768)")
    parser.add_argument("--layout", default="Flat", help="Flat, HNSW32,SQ8:efSearch=128, torch-fp16, ...")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs a GPU layout is split over")
    parser.add_argument("--gpu_gib", type=float, help="memory per GPU; checks the plan beside training")
    parser.add_argument("--sglang_mem_fraction_static", type=float, default=0.0, help="SGLang's static fraction")
    parser.add_argument("--trainer_gib", type=float, default=0.0, help="what the colocated trainer keeps per GPU")
    parser.add_argument("--ram_gib", type=float, help="RAM to check CPU layouts against (default: available now)")
    parser.add_argument("--mmap", action="store_true", help="Flat memory-mapped (--faiss_mmap)")
    parser.add_argument("--table", action="store_true", help="print the markdown table of every layout on 1-8 GPUs")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    corpus_size, dim = args.corpus_size, args.dim
    if args.index_path:
        from local_dense_retriever.retrieval.index_files import read_header

        header = read_header(args.index_path) if os.path.isfile(args.index_path) else None
        if header is None:
            parser.error(f"--index_path {args.index_path}: accepted is an existing FAISS index file")
        corpus_size, dim = header.size, header.dim
    for flag, value in (("--corpus_size", corpus_size), ("--dim", dim)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if args.gpus < 0 or (args.gpu_gib is not None and not args.gpu_gib > 0) or args.trainer_gib < 0:
        parser.error("--gpus, --gpu_gib and --trainer_gib: accepted are non-negative numbers (--gpu_gib positive)")
    if args.table:
        print(markdown_table(corpus_size, dim))
        return 0
    try:
        plan = plan_and_check(
            args.layout,
            corpus_size,
            dim,
            gpus=args.gpus,
            gpu_total_bytes=int(args.gpu_gib * GIB) if args.gpu_gib else None,
            sglang_mem_fraction_static=args.sglang_mem_fraction_static,
            trainer_bytes=int(args.trainer_gib * GIB),
            ram_available=int(args.ram_gib * GIB) if args.ram_gib else available_ram(),
            mmap=args.mmap,
        )
    except ValueError as err:  # MemoryPlanError and layout syntax
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(plan)) if args.json else plan.describe())
    return 0
