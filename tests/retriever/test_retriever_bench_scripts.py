"""The scale benchmarks' own logic, at tiny scale: the GPU command on a machine without a GPU, the real-text
passages, and the layout targets' verdicts."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import approximate_layouts  # noqa: E402
import real_text  # noqa: E402


def test_gpu_benchmark_says_there_is_no_gpu_and_exits_0():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU this machine has
    result = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_search.py"), "--no_write"], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "no GPU is visible to torch here" in result.stdout


def test_real_text_passages_end_at_sentences_and_stay_short():
    text = "One two three. Four five six seven. Eight nine ten eleven twelve. Thirteen."
    assert real_text.split_passages(text, words=7) == [
        "One two three. Four five six seven.",
        "Eight nine ten eleven twelve. Thirteen.",
    ]
    assert real_text.split_passages("A single sentence that is longer than the limit.", words=3) == [
        "A single sentence that is longer than the limit."
    ]


def point(mode: str, size: str, qps: float):
    return SimpleNamespace(mode=mode, size=size, concurrency=256, qps=qps, p50_ms=1.0, p99_ms=2.0)


def test_layout_targets_pass_and_fail_on_the_figures():
    runs = [SimpleNamespace(mode=p.mode, points=[p]) for p in
            (point("on", "10k", 500.0), point("on", "1m", 100.0), point("layout", "1m", 420.0))]  # fmt: skip
    info = {"spec": "HNSW32:efSearch=256", "recall_at_3": 0.993, "bytes": 2**30, "flat_bytes": 2**30}
    text = approximate_layouts.render({"1m": info}, runs)
    assert "- PASS: 1m, 256 clients: layout >= 4.0x Flat's QPS: 420.0 vs 100.0 (4.2x)" in text
    assert "- PASS: 1m, 256 clients: layout >= 60% of the server's QPS at 10k: 420.0 vs 500.0 (84%)" in text
    assert "- PASS: 1m: recall@3 >= 0.99 against Flat: 0.9930" in text
    runs[2].points[0].qps = 390.0
    info["recall_at_3"] = 0.985
    text = approximate_layouts.render({"1m": info}, runs)
    assert "- FAIL: 1m, 256 clients: layout >= 4.0x" in text and "- FAIL: 1m: recall@3" in text
    assert "bound" not in text  # no ceilings given


def test_layout_render_states_the_encoders_bound_on_the_ratio():
    runs = [SimpleNamespace(mode=p.mode, points=[p]) for p in (point("on", "1m", 100.0), point("layout", "1m", 250.0))]
    info = {"spec": "HNSW32:efSearch=256", "recall_at_3": 0.993, "bytes": 2**30, "flat_bytes": 2**30}
    ceilings = {"1m": {"encode_ms": 160.0, "search_ms": 320.0, "batch": 64}}
    text = approximate_layouts.render({"1m": info}, runs, ceilings=ceilings)
    assert ("- bound: 1m: the ceiling's encode takes 160 ms and Flat's search 320 ms per 64 queries, so no layout can "
            "serve more than 3.0x Flat's QPS with this encoder") in text  # fmt: skip
