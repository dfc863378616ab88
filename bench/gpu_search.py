"""GPU figures in one command (`make bench-gpu`, a few minutes on one H100): the query encoder's tokens/s in fp16,
and exact torch search (local_dense_retriever/retrieval/torch_search.py) at 256 queries in flight over synthetic
fp16 shards the size one GPU holds of wiki-18 (21M x 768) split over 8, 2 and 1 GPUs, with the GPU memory used.
Without a visible GPU it says so and exits 0.

    python bench/gpu_search.py               # writes `## GPU search` in bench/RESULTS.md
    python bench/gpu_search.py --no_write

Encoders: MiniLM-L6 (the shipped one) and a BERT-base-shaped model (e5-base-v2's shape, random weights: speed
only) on the 10,033 real summaries, sorted by length in batches of up to 65,536 padded tokens as the index builder
runs them. Search: vectors drawn at random and normalised on the GPU (speed does not depend on the values), 256
random unit queries per call (the server's GPU batch is up to 512), top-3; single queries too. A shard size is
skipped when the GPU's free memory cannot hold it with the workspace.
"""

import argparse
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

WIKI18 = 21_015_324
DIM = 768
SHARDS = {"21M/8": WIKI18 // 8 + 1, "21M/2": WIKI18 // 2 + 1, "21M": WIKI18}
SECTION = "GPU search"


def encoder_tokens_per_s(shape: str, texts: list[str], repeats: int = 3) -> float:
    """Tokens/s of passage encoding in fp16 on the first GPU: `minilm` (the shipped model) or `bert-base`
    (e5-base-v2's shape, random weights: speed only; MiniLM's tokenizer)."""
    import torch

    from local_dense_retriever.demo import mini_wiki
    from local_dense_retriever.retrieval.encoders import TextEncoder

    encoder = TextEncoder(str(mini_wiki.minilm_model_dir()), retriever_name="e5", device="cuda", dtype="fp16")
    if shape == "bert-base":
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        encoder.model = BertModel(config).half().cuda().eval()
        encoder._forward, encoder.dim = encoder.model, 768
    tokens = sum(min(len(ids), encoder.max_length) for ids in encoder.tokenizer(texts)["input_ids"])
    encoder.encode_passages(texts[:512])  # warm-up
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        encoder.encode_passages(texts)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    return tokens / best


ENCODERS = {"minilm": "MiniLM-L6 (shipped)", "bert-base": "BERT-base shape (e5-base-v2's size, random weights)"}


def search_figures(rows: int, reps: int = 20) -> dict:
    import torch

    from local_dense_retriever.retrieval.torch_search import TorchExactIndex

    device = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    shard = torch.empty((rows, DIM), dtype=torch.float16, device=device)
    for start in range(0, rows, 1 << 20):  # drawn in slices: a full fp32 draw would need twice the memory
        part = torch.randn((min(rows, start + (1 << 20)) - start, DIM), device=device)
        shard[start : start + len(part)] = torch.nn.functional.normalize(part, dim=1).half()
    del part  # its fp32 slice is not part of what serving holds
    index = TorchExactIndex.from_shards([shard])
    queries = torch.nn.functional.normalize(torch.randn(256, DIM), dim=1).numpy()
    drawing_peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)  # from here: what serving holds (vectors) and adds (workspace)
    index.search_vectors(queries, 3)  # warm-up
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        index.search_vectors(queries, 3)  # returns host arrays: synchronised
        times.append(time.perf_counter() - began)
    single = []
    for i in range(reps):
        began = time.perf_counter()
        index.search_vectors(queries[i : i + 1], 3)
        single.append(time.perf_counter() - began)
    peak = torch.cuda.max_memory_allocated(device)
    del index, shard
    torch.cuda.empty_cache()
    times.sort()
    single.sort()
    return {"qps": 256 / times[len(times) // 2], "batch_ms": 1000 * times[len(times) // 2],
            "single_ms": 1000 * single[len(single) // 2], "peak_gib": peak / 2**30,
            "drawing_peak_gib": drawing_peak / 2**30, "planned_gib": planned_bytes(rows) / 2**30}  # fmt: skip


def agreement_with_exact(rows: int = 200_000, queries: int = 256, k: int = 10) -> list[dict]:
    """The torch searcher on the GPU against exact fp32 top-k computed on the CPU (what FAISS Flat returns), over
    random unit vectors: per precision and shard count, the share of rows equal, whether every differing row ties
    within that precision's score error, and the largest score difference."""
    import numpy as np
    import torch

    from local_dense_retriever.retrieval.torch_search import TorchExactIndex

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((rows, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    asked = rng.standard_normal((queries, DIM), dtype=np.float32)
    asked /= np.linalg.norm(asked, axis=1, keepdims=True)
    exact = asked @ vectors.T
    want_rows = np.argsort(-exact, axis=1)[:, :k]
    want_scores = np.take_along_axis(exact, want_rows, axis=1)
    results = []
    for dtype, shards, workspace_mb in (("fp32", 1, None), ("fp16", 1, None), ("fp16", 3, 8), ("bf16", 2, 8)):
        index = TorchExactIndex(vectors, [torch.device("cuda", 0)] * shards, dtype=dtype, workspace_mb=workspace_mb)
        scores, found = index.search_vectors(asked, k)
        error = float(np.abs(scores - want_scores).max())
        differ = found != want_rows
        # a differing row is a tie at this precision when its exact score is as close to the expected as the error
        gaps = np.abs(np.take_along_axis(exact, found, axis=1) - want_scores)[differ]
        ties_only = bool((gaps <= 2 * error).all())
        results.append({"dtype": dtype, "shards": shards, "chunk_rows": index.chunk_rows(queries),
                        "equal": 1 - differ.mean(), "ties_only": ties_only, "error": error})  # fmt: skip
        del index
        torch.cuda.empty_cache()
    return results


def planned_bytes(rows: int) -> int:
    """What the memory plan (`python -m local_dense_retriever.memory_plan`) counts on a GPU for serving these rows
    in torch-fp16, without the encoder and the CUDA context (not in torch's allocated bytes): vectors + workspace."""
    from local_dense_retriever.retrieval.memory_plan import plan_memory

    parts = plan_memory("torch-fp16", rows, DIM, gpus=1).gpu_parts
    return parts["vectors"] + parts["workspace"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no_write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no GPU is visible to torch here (torch.cuda.is_available() is False): nothing to measure; run "
              "`make bench-gpu` on a GPU node")  # fmt: skip
        return 0
    import results_md

    from local_dense_retriever.demo import mini_wiki

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    gpu = torch.cuda.get_device_name(0)
    total = torch.cuda.get_device_properties(0).total_memory
    texts = [mini_wiki.format_contents(s["title"], s["extract"]) for s in mini_wiki.load_summaries()]
    lines = [
        f"Measured by `python bench/gpu_search.py {' '.join(argv or sys.argv[1:])}`".rstrip()
        + f" on {started}; {gpu} ({total / 2**30:.0f} GiB), {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}.",
        "",
        "| encoder (fp16, 10,033 real summaries) | tokens/s |",
        "|---|---|",
    ]
    for shape, name in ENCODERS.items():
        lines.append(f"| {name} | {encoder_tokens_per_s(shape, texts):,.0f} |")
        print(lines[-1], flush=True)
    lines += ["", "| vectors on the GPU (768-d fp16) | rows | QPS, 256 in flight | ms per 256 | single query ms "
              "| peak GPU memory searching | memory plan (vectors + workspace) | peak while drawing the vectors |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, rows in SHARDS.items():
        needed = rows * DIM * 2 + 2 * 2**30
        free, _ = torch.cuda.mem_get_info(0)
        if needed > free:
            lines.append(f"| {label} | {rows:,} | skipped: needs {needed / 2**30:.1f} GiB, "
                         f"{free / 2**30:.1f} GiB free | | | | | |")  # fmt: skip
        else:
            f = search_figures(rows)
            lines.append(f"| {label} | {rows:,} | {f['qps']:,.0f} | {f['batch_ms']:.1f} | {f['single_ms']:.2f} "
                         f"| {f['peak_gib']:.2f} GiB | {f['planned_gib']:.2f} GiB "
                         f"| {f['drawing_peak_gib']:.1f} GiB |")  # fmt: skip
        print(lines[-1], flush=True)
    lines += ["", "Agreement with exact search (fp32 top-10 of 256 random unit queries over 200,000 random 768-d "
              "unit vectors, computed on the CPU as FAISS Flat does), the torch searcher on the GPU:", "",
              "| precision | shards | rows per chunk | rows equal | the others tie within the score error "
              "| largest score difference |", "|---|---|---|---|---|---|"]  # fmt: skip
    for a in agreement_with_exact():
        lines.append(f"| {a['dtype']} | {a['shards']} | {a['chunk_rows']:,} | {a['equal']:.2%} "
                     f"| {'yes' if a['ties_only'] else 'NO'} | {a['error']:.1e} |")  # fmt: skip
        print(lines[-1], flush=True)
    results_md.report(SECTION, "\n".join(lines) + "\n", write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
