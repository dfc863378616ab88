"""The index tuner's command line (python -m local_dense_retriever.tune_index): its flags, checked before anything
is loaded, into a TuneConfig; the run; tuning.md and tuning.json written and the table printed."""

import argparse
import logging
import shlex
import sys
from pathlib import Path

from local_dense_retriever.building.tuner import TuneConfig, tune
from local_dense_retriever.building.tuner_candidates import expand
from local_dense_retriever.building.tuner_report import render_markdown, write_report
from local_dense_retriever.retrieval.index_files import read_header


def main(argv: list[str] | None = None) -> int:
    from local_dense_retriever.retrieval import cpu_threads

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_config(argv)
    import faiss  # noqa: F401  (loaded now, so that both pools are sized)
    import torch  # noqa: F401

    cpu_threads.configure_pools(cpu_threads.thread_count())
    command = "python -m local_dense_retriever.tune_index " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    try:
        report = tune(config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    markdown, data = write_report(report, config.output_dir, command)
    print(render_markdown(report, command))
    print(f"wrote {markdown} and {data}")
    return 0


def threshold_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: accepted is a recall in (0, 1], e.g. 0.99")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure candidate index layouts against a Flat index and name the cheapest that keeps recall.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--index_path", required=True, help="the Flat index (or the builder's saved .npy embeddings)")
    parser.add_argument("--corpus_path", required=True, help="its corpus .jsonl (the server needs it)")
    parser.add_argument("--retriever_name", default="e5")
    parser.add_argument("--retriever_model", default="intfloat/e5-base-v2", help="the encoder of the index")
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--pooling_method", choices=["auto", "mean", "cls", "pooler"], default="auto")
    parser.add_argument(
        "--queries", help="training or test questions as held-out queries (.parquet/.jsonl/.json/.txt)"
    )
    parser.add_argument("--num_queries", type=int, default=1000, help="queries drawn from that file (or the corpus)")
    parser.add_argument("--threshold", type=threshold_value, default=0.99, help="recall@3 to keep, in (0, 1]")
    parser.add_argument(
        "--candidates",
        nargs="+",
        help='layouts to try, "/" between values: HNSW32:efSearch=64/128 "IVF4096,SQ8:nprobe=32/64" (default: '
        "HNSW16/32 and HNSW32,SQ8 at three efSearch; IVF Flat, SQ8, PQ at three nprobe)",
    )
    parser.add_argument("--out_dir", help="for tuning.md, tuning.json and the recommended index (default: beside it)")
    parser.add_argument(
        "--serve",
        choices=["all", "passing", "none"],
        default="all",
        help="measure through the real server: every layout, only those at the threshold, or none",
    )
    parser.add_argument("--clients", type=int, default=256, help="closed-loop clients in flight for the QPS figure")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per layout at --clients")
    parser.add_argument("--train_size", type=int, default=200_000, help="vectors IVF/PQ/SQ train on (>= 64 per list)")
    parser.add_argument("--no_keep", action="store_true", help="do not keep the recommended layout's index file")
    parser.add_argument("--no_progress", action="store_true")
    parser.add_argument(
        "--server_args", default="", help="more flags for the measured servers, e.g. '--num_threads 8'"
    )
    return parser


def parse_config(argv: list[str] | None = None) -> TuneConfig:
    from local_dense_retriever.retrieval.model_source import check_model_source

    parser = build_parser()
    args = parser.parse_args(argv)
    header = read_header(args.index_path) if Path(args.index_path).is_file() else None
    if not Path(args.index_path).is_file():
        parser.error(f"--index_path {args.index_path}: no such file")
    if not args.index_path.endswith(".npy") and (header is None or not header.is_flat):
        parser.error(f"--index_path {args.index_path}: accepted is a Flat FAISS index or a .npy of embeddings")
    if not Path(args.corpus_path).is_file():
        parser.error(f"--corpus_path {args.corpus_path}: no such file")
    if args.queries and not Path(args.queries).is_file():
        parser.error(f"--queries {args.queries}: no such file")
    for flag in ("num_queries", "clients", "max_length", "train_size"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if not args.seconds > 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    for spec in args.candidates or []:
        try:
            expand(spec)
        except ValueError as err:
            parser.error(f"--candidates {err}")
    try:
        model = check_model_source(args.retriever_model)
    except ValueError as err:
        parser.error(f"--retriever_model {err}")
    return TuneConfig(
        index_path=args.index_path,
        corpus_path=args.corpus_path,
        retriever_name=args.retriever_name,
        retriever_model=model,
        max_length=args.max_length,
        pooling_method=args.pooling_method,
        queries_path=args.queries,
        num_queries=args.num_queries,
        threshold=args.threshold,
        candidates=args.candidates,
        out_dir=args.out_dir,
        serve=args.serve,
        clients=args.clients,
        seconds=args.seconds,
        train_size=args.train_size,
        server_args=shlex.split(args.server_args),
        keep=not args.no_keep,
        progress=not args.no_progress,
    )
