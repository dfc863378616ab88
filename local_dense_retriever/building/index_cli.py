"""The index builder's command line (python -m local_dense_retriever.index_builder): its flags, Search-R1's and
FlashRAG's included (--retrieval_method, --model_path, --use_fp16, --save_embedding, --embedding_path), checked
before anything is encoded (the factory string, the search parameters, the model), into a BuildConfig; the build."""

import argparse
import logging
import re
import sys
from pathlib import Path

from local_dense_retriever.building.index import build
from local_dense_retriever.building.index_config import BuildConfig, default_index_path
from local_dense_retriever.building.layouts import set_search_params
from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.retrieval.corpus import CorpusFormatError
from local_dense_retriever.retrieval.model_source import check_model_source


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Before parse_config imports faiss and encoding imports torch (OpenMP reads it only then).
    known, _ = build_parser().parse_known_args(argv)
    cpu_threads.set_wait_policy(tuned=known.num_threads is None)
    config = parse_config(argv)
    try:
        summary = build(config)
    except (CorpusFormatError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"indexed {summary.documents} documents into {summary.output} in {summary.seconds:.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Encode a corpus jsonl into a FAISS index, a Qdrant collection or a BM25 index.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--corpus_path", required=True, help="corpus .jsonl or .jsonl.gz")
    parser.add_argument("--retriever_name", "--retrieval_method", default="e5", help="e5, bge, dpr, any name, bm25")
    parser.add_argument("--retriever_model", "--model_path", default="intfloat/e5-base-v2")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--index_path", help="output FAISS index file (BM25: directory)")
    out.add_argument("--save_dir", help="output directory; the file is named <retriever_name>_<faiss_type>.index")
    parser.add_argument("--backend", choices=["faiss", "qdrant"], default="faiss")
    parser.add_argument("--faiss_type", default="Flat", help="faiss.index_factory string: Flat, HNSW32, IVF4096,PQ64")
    parser.add_argument("--metric", choices=["ip", "l2"], default="ip")
    parser.add_argument("--faiss_gpu", action="store_true", help="train and add on the first GPU (IVF/PQ k-means)")
    parser.add_argument("--train_size", type=int, default=200_000, help="vectors used to train IVF/PQ types")
    parser.add_argument("--chunk_size", type=int, default=16_384, help="passages encoded and added at a time")
    parser.add_argument("--max_length", type=int, default=256, help="passage tokens kept by the encoder")
    parser.add_argument("--batch_size", type=int, default=None, help="max passages per forward pass")
    parser.add_argument("--max_tokens_per_forward", type=int, default=None, help="padded tokens per forward pass")
    parser.add_argument("--num_threads", type=int, default=None, help="CPU threads for encoding (usable CPUs)")
    parser.add_argument("--pooling_method", choices=["auto", "mean", "cls", "pooler"], default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", choices=["auto", "fp32", "fp16", "bf16"], default="auto", help="auto: fp16 on GPU")
    parser.add_argument("--use_fp16", action="store_true", help="same as --dtype fp16 (FlashRAG's flag)")
    parser.add_argument(
        "--from_index",
        help="a Flat FAISS index of this corpus: build --faiss_type from its vectors (no encoding; the tuner's way)",
    )
    parser.add_argument(
        "--faiss_search_params", help='written into the index, e.g. "efSearch=128" (HNSW) or "nprobe=64" (IVF)'
    )
    parser.add_argument(
        "--hnsw_ef_construction",
        type=int,
        default=None,
        help="HNSW only: the graph's build-time breadth (FAISS's default 40); higher keeps recall at a given "
        "efSearch for a longer build (the tuner measures it: --candidates HNSW32:efConstruction=200,efSearch=256)",
    )
    parser.add_argument(
        "--embeddings_path",
        "--embedding_path",
        help="float32 .npy of passage embeddings to index instead of encoding",
    )
    saving = parser.add_mutually_exclusive_group()
    saving.add_argument("--save_embeddings", help="also write the passage embeddings to this .npy file")
    saving.add_argument(
        "--save_embedding",
        action="store_true",
        help="FlashRAG's flag: write them to emb_<retriever_name>.npy beside the index",
    )
    parser.add_argument("--qdrant_url", help="Qdrant server URL (--backend qdrant)")
    parser.add_argument("--qdrant_path", help="qdrant-client embedded storage directory (--backend qdrant)")
    parser.add_argument("--qdrant_collection", default="search_r1")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing Qdrant collection")
    parser.add_argument("--no_progress", action="store_true")
    return parser


def parse_config(argv: list[str] | None = None) -> BuildConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not Path(args.corpus_path).is_file():
        parser.error(f"--corpus_path {args.corpus_path}: no such file")
    if args.embeddings_path and not Path(args.embeddings_path).is_file():
        parser.error(f"--embeddings_path {args.embeddings_path}: no such file")
    if args.from_index:
        from local_dense_retriever.retrieval.index_files import read_header

        header = read_header(args.from_index) if Path(args.from_index).is_file() else None
        if header is None or not header.is_flat:
            parser.error(f"--from_index {args.from_index}: accepted is an existing Flat FAISS index file")
        if args.embeddings_path or args.backend != "faiss" or args.retriever_name.lower() == "bm25":
            parser.error("--from_index builds a FAISS index: accepted without --embeddings_path, qdrant and bm25")
    is_bm25 = args.retriever_name.lower() == "bm25"
    index_path = args.index_path
    if args.save_dir:
        index_path = default_index_path(args.save_dir, args.retriever_name, args.faiss_type)
    if (is_bm25 or args.backend == "faiss") and not index_path:
        parser.error("give --index_path or --save_dir for the output")
    if args.backend == "qdrant" and not is_bm25 and bool(args.qdrant_url) == bool(args.qdrant_path):
        parser.error("--backend qdrant needs exactly one of --qdrant_url and --qdrant_path")
    for flag in ("train_size", "chunk_size", "max_length", "batch_size", "max_tokens_per_forward", "num_threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag} must be at least 1, got {value}")
    if args.hnsw_ef_construction is not None and (args.hnsw_ef_construction < 1 or "HNSW" not in args.faiss_type):
        parser.error(
            f"--hnsw_ef_construction {args.hnsw_ef_construction}: accepted is an integer >= 1 with an HNSW "
            f"--faiss_type (got --faiss_type {args.faiss_type})"
        )
    if not is_bm25 and args.backend == "faiss" and (not args.embeddings_path or args.faiss_search_params):
        try:
            import faiss

            probe = faiss.index_factory(768, args.faiss_type)  # syntax check before hours of encoding
        except RuntimeError as err:
            parser.error(f"--faiss_type {args.faiss_type!r} is not a valid faiss.index_factory string: {err}")
        try:
            set_search_params(probe, args.faiss_search_params)
        except RuntimeError as err:
            reason = re.sub(r"^Error in .*? at \S+:\d+: ", "", str(err).strip())
            parser.error(
                f"--faiss_search_params {args.faiss_search_params!r} does not apply to {args.faiss_type}: {reason}"
            )
    model = args.retriever_model
    if (
        not is_bm25 and not args.embeddings_path and not args.from_index
    ):  # last: for a hub id that is not cached this asks the hub
        try:
            model = check_model_source(args.retriever_model)
        except ValueError as err:
            parser.error(f"--retriever_model {err}")
    return BuildConfig(
        corpus_path=args.corpus_path,
        index_path=index_path,
        retriever_name=args.retriever_name,
        retriever_model=model,
        backend=args.backend,
        faiss_type=args.faiss_type,
        metric=args.metric,
        faiss_gpu=args.faiss_gpu,
        train_size=args.train_size,
        chunk_size=args.chunk_size,
        max_length=args.max_length,
        batch_size=args.batch_size,
        max_tokens_per_forward=args.max_tokens_per_forward,
        num_threads=args.num_threads,
        pooling_method=args.pooling_method,
        device=args.device,
        dtype="fp16" if args.use_fp16 else args.dtype,
        embeddings_path=args.embeddings_path,
        from_index=args.from_index,
        faiss_search_params=args.faiss_search_params,
        hnsw_ef_construction=args.hnsw_ef_construction,
        save_embeddings=(
            str(Path(index_path).parent / f"emb_{args.retriever_name}.npy")
            if args.save_embedding
            else args.save_embeddings
        ),
        qdrant_url=args.qdrant_url,
        qdrant_path=args.qdrant_path,
        qdrant_collection=args.qdrant_collection,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
