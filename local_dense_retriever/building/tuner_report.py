"""What a tuning run reports: one Row per layout measured, the recommendation among them (the fewest bytes among
the fastest that keep recall), and the report as markdown (tuning.md) and JSON (tuning.json)."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from local_dense_retriever.retrieval.layouts import parse_layout

QPS_TIE = 0.95  # layouts within 5% of the best QPS count as equally fast: the fewest bytes wins among them


@dataclass
class Row:
    layout: str
    recall: dict  # "1", "3", "10" -> recall@k against the Flat answers
    search_qps: float  # in-process, batches of 64, every CPU
    index_bytes: int
    build_seconds: float
    gpu_bytes: int = 0
    single_ms: float | None = None  # server, one client: p50
    qps: float | None = None  # server, --clients in flight
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int | None = None
    server_rss_mb: float | None = None
    note: str = ""

    @property
    def recall_at_3(self) -> float:
        return self.recall["3"]

    def fill(self, measured: dict) -> None:
        """The server's figures (tuner_measures.measure_server) into this row."""
        for key, value in measured.items():
            if key != "precision":
                setattr(self, key, value)


@dataclass
class Report:
    rows: list[Row]
    recommended: str | None
    threshold: float
    queries: str
    corpus_size: int
    dim: int
    server_precision: str | None
    tuner_peak_rss_mb: float
    index_file: str | None  # the recommended layout, written with its search parameters
    seconds: float


def recommend(rows: list[Row], threshold: float, flat_comparable: bool = True) -> Row | None:
    """Among CPU rows at or above the threshold, exact Flat included (GPU rows are shown beside, not chosen: GPU
    memory and RAM are not the same cost): those within 5% of the best QPS (server QPS when measured for all of
    them, else in-process search queries/s), then the fewest bytes, then the fastest. So Flat is the answer when it
    is as fast as the fastest and no faster layout is smaller. `flat_comparable`: False when Flat's figures are not
    a served Flat index's (saved embeddings), which leaves it out."""
    passing = [
        row
        for row in rows
        if not row.gpu_bytes and row.recall_at_3 >= threshold and (flat_comparable or row.layout != "Flat")
    ]
    if not passing:
        return None
    served = all(row.qps is not None for row in passing)

    def speed(row: Row) -> float:
        return row.qps if served else row.search_qps

    best = max(speed(row) for row in passing)
    near = [row for row in passing if speed(row) >= QPS_TIE * best]
    return min(near, key=lambda row: (row.index_bytes + row.gpu_bytes, -speed(row)))


def render_markdown(report: Report, command: str) -> str:
    lines = [
        f"# Index tuning: {report.corpus_size:,} vectors x {report.dim}",
        "",
        f"`{command}`",
        "",
        f"Queries: {report.queries}. Recall@k: share of the Flat (exact) top-k rows the layout returns. "
        "Search q/s: in-process, batches of 64, every CPU. Server: the real server on 127.0.0.1, p50 of one client, "
        f"QPS and p50/p99 at the clients in flight; encoder precision {report.server_precision or 'not served'}.",
        "",
        "| layout | recall@1 | recall@3 | recall@10 | search q/s | single-query ms | QPS | p50 / p99 ms | errors "
        "| index MiB | server peak RSS MiB | build s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def number(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for row in report.rows:
        mark = " **(recommended)**" if row.layout == report.recommended else ""
        p50_p99 = "-" if row.p50_ms is None else f"{row.p50_ms:.0f} / {row.p99_ms:.0f}"
        rss = "-" if row.server_rss_mb is None else f"{row.server_rss_mb:.0f}"
        lines.append(
            f"| {row.layout}{mark} | {row.recall['1']:.4f} | {row.recall['3']:.4f} | {row.recall['10']:.4f} "
            f"| {row.search_qps:.0f} | {number(row.single_ms, '.1f')} | {number(row.qps, '.1f')} | {p50_p99} "
            f"| {number(row.errors, 'd')} | {row.index_bytes / 2**20:.1f} | {rss} | {row.build_seconds:.1f} |"
        )
    lines += ["", recommendation_text(report), "", f"Tuner peak RSS {report.tuner_peak_rss_mb / 1024:.2f} GiB; "
              f"{report.seconds:.0f} s in all."]  # fmt: skip
    return "\n".join(lines) + "\n"


def recommendation_text(report: Report) -> str:
    if report.recommended is None:
        return (f"No layout kept recall@3 >= {report.threshold}: build a Flat index to serve (or use --torch_search "
                "on GPUs), or try larger efSearch / nprobe (--candidates).")  # fmt: skip
    if report.recommended == "Flat":
        return (
            f"Recommended: **Flat** (exact; the fewest bytes among the fastest that keep recall@3 >= "
            f"{report.threshold}): no approximate layout is faster by more than 5% and smaller. Keep serving "
            f"`--index_path {report.index_file}`."
        )
    layout = parse_layout(report.recommended)
    serve = f"--index_path {report.index_file}" if report.index_file else f"--index_path <the {layout.factory} index>"
    params = f" --faiss_search_params {layout.params}" if layout.params else ""
    return (
        f"Recommended: **{report.recommended}** (recall@3 >= {report.threshold}, the fewest bytes among the "
        f"fastest). Serve it: `retrieval_server.py {serve}{params} ...`; build it again from the Flat index: "
        f"`python -m local_dense_retriever.index_builder --corpus_path <corpus> --from_index <Flat index> "
        f"--faiss_type {layout.factory}{params}"
        f"{f' --hnsw_ef_construction {layout.ef_construction}' if layout.ef_construction else ''} --index_path <out>`."
    )


def write_report(report: Report, out_dir: Path, command: str) -> tuple[Path, Path]:
    markdown, data = out_dir / "tuning.md", out_dir / "tuning.json"
    markdown.write_text(render_markdown(report, command))
    data.write_text(json.dumps({**asdict(report), "command": command}, indent=1))
    return markdown, data
