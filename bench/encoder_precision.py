"""The query encoder at reduced precision on this CPU: fp32, bf16 (native on AVX512-BF16 / AMX) and int8 (dynamic
quantisation of the Linear layers), each as the server runs it (traced graph, every CPU, batches of 64 and single
queries), with top-3 agreement against fp32 on real questions over real text, and what the server's rule
(local_dense_retriever/retrieval/precision.py: >= 1.15x fp32's queries/s and >= 99% of top-3 row sets equal to
fp32's) would choose here.

    python bench/encoder_precision.py          # about 3 minutes here (builds bench/real_text.py's corpus once)

Queries: FanOutQA's 2,193 dev sub-questions; index: the real-text passages' MiniLM Flat index (exact search, so
only the encoder differs). Rounds alternate the precisions and the best of --rounds is kept for each, so a drifting
shared machine favours none. Writes `## Encoder precision on CPU` in bench/RESULTS.md (unless --no_write).
"""

import argparse
import platform
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import real_text  # noqa: E402
import results_md  # noqa: E402
from local_dense_retriever.demo import embedded_default, mini_wiki  # noqa: E402

SECTION = "Encoder precision on CPU"
TARGET_SPEEDUP = 1.5
BATCH = 64


def main(argv: list[str] | None = None) -> int:
    import faiss
    import torch

    from local_dense_retriever.retrieval import cpu_threads, precision
    from local_dense_retriever.retrieval.encoders import TextEncoder

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over the questions per precision")
    parser.add_argument("--singles", type=int, default=200, help="single-query encodes timed per precision")
    parser.add_argument("--summaries", type=int, help="only the first N summaries (a tiny run to check the script)")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    corpus = real_text.prepare(summaries=args.summaries)
    questions = real_text.questions()
    cpu_threads.configure_pools(cpu_threads.thread_count())
    flags = precision.cpu_flags()
    # Both reduced precisions, whatever the server would try: the table shows why it tries the one it does.
    names = ["fp32", *(["bf16"] if {"avx512_bf16", "amx_bf16"} & flags else []), "int8"]
    model_dir = str(mini_wiki.minilm_model_dir())
    encoders = {name: TextEncoder(model_dir, retriever_name=embedded_default.RETRIEVER_NAME, device="cpu",
                                  dtype=name, max_length=embedded_default.MAX_LENGTH) for name in names}  # fmt: skip
    index = faiss.read_index(str(corpus.index_path))
    batch_qps = {name: 0.0 for name in names}
    single_ms = {name: float("inf") for name in names}
    vectors = {}
    for _ in range(args.rounds):
        for name, encoder in encoders.items():
            qps, vectors[name] = precision.time_encoding(encoder, questions)
            batch_qps[name] = max(batch_qps[name], qps)
            began = time.perf_counter()
            for question in questions[: args.singles]:
                encoder.encode_queries([question])
            single_ms[name] = min(single_ms[name], 1000 * (time.perf_counter() - began) / args.singles)
    rows = {name: index.search(vectors[name], 3)[1] for name in names}
    agreement = {name: precision.agreement(rows[name], rows["fp32"]) for name in names}
    cosine = {name: float((vectors[name] * vectors["fp32"]).sum(axis=1).min()) for name in names}

    def rule(name: str) -> bool:
        speedup = batch_qps[name] / batch_qps["fp32"]
        return speedup >= precision.MIN_SPEEDUP and agreement[name] >= precision.MIN_AGREEMENT

    passing = [name for name in names[1:] if rule(name)]
    chosen = max(passing, key=batch_qps.get) if passing else "fp32"
    isa = sorted(f for f in flags if f.startswith(("avx512_bf16", "amx", "avx512_vnni", "avx512f")))
    lines = [
        f"Measured by `python bench/encoder_precision.py {' '.join(argv or sys.argv[1:])}`".rstrip()
        + f" on {started}; {platform.processor() or platform.machine()}, {cpu_threads.thread_count()} CPUs "
        f"(flags: {', '.join(isa) or 'none of avx512f, avx512_bf16, amx'}), torch {torch.__version__}. MiniLM-L6 "
        f"traced as the server runs it, {len(questions)} FanOutQA sub-questions in batches of {BATCH} (best of "
        f"{args.rounds} alternating rounds) and {args.singles} single queries; top-3 over the real-text Flat index "
        f"({corpus.passages:,} passages, exact search: only the encoder differs).",
        "",
        "| precision | queries/s, batches of 64 | vs fp32 | single query ms | top-3 rows equal to fp32's | min cosine "
        "to fp32 | server's rule |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        verdict = "baseline" if name == "fp32" else ("passes" if rule(name) else "refused")
        lines.append(
            f"| {name} | {batch_qps[name]:.0f} | {batch_qps[name] / batch_qps['fp32']:.2f}x | {single_ms[name]:.1f} "
            f"| {agreement[name]:.2%} | {cosine[name]:.4f} | {verdict} |"
        )
    best = max(names[1:], key=lambda n: batch_qps[n] if agreement[n] >= precision.MIN_AGREEMENT else 0, default=None)
    lines += ["", f"The server's `--dtype measured` would use **{chosen}** here."]
    if best is not None and agreement[best] >= precision.MIN_AGREEMENT:
        speedup = batch_qps[best] / batch_qps["fp32"]
        lines.append(f"- {'PASS' if speedup >= TARGET_SPEEDUP else 'FAIL'}: {best} at >= 99% agreement gives "
                     f"{speedup:.2f}x fp32's queries/s (target >= {TARGET_SPEEDUP}x).")  # fmt: skip
    else:
        lines.append("- no reduced precision keeps 99% of top-3 rows here: fp32 is kept.")
    results_md.report(SECTION, "\n".join(lines) + "\n", write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
