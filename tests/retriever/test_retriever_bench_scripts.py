"""The scale benchmarks' own logic, at tiny scale: the GPU command on a machine without a GPU, the real-text
passages, and the layout targets' verdicts."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import approximate_layouts  # noqa: E402
import load_tail  # noqa: E402
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


def test_synthetic_vectors_keep_the_real_rows_then_add_noisy_unit_copies():
    import load_corpora

    rng = np.random.default_rng(5)
    real = rng.normal(size=(50, 384)).astype(np.float32)
    real /= np.linalg.norm(real, axis=1, keepdims=True)
    chunks = list(load_corpora.synthetic_vectors(real, 180, chunk=64))
    assert [len(chunk) for chunk in chunks] == [64, 64, 52]  # chunked as asked, n rows in all
    rows = np.concatenate(chunks)
    np.testing.assert_allclose(rows[:50], real, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    cosine = np.sum(rows[50:] * real[np.arange(50, 180) % 50], axis=1)
    assert 0.7 < cosine.min() and cosine.max() < 0.9  # sigma 0.04 in 384-d: ~0.79 to the source
    again = np.concatenate(list(load_corpora.synthetic_vectors(real, 180, chunk=100)))
    np.testing.assert_array_equal(again[:100], rows[:100])  # seeded: the chunk size does not change the first chunk


def test_calibration_verdicts_say_which_corpus_is_harder_and_how_fast_it_falls():
    import synthetic_calibration as calibration

    real = {8_000: [0.94, 0.97, 0.99, 0.996], 16_000: [0.91, 0.96, 0.985, 0.995], 32_000: [0.90, 0.95, 0.975, 0.99]}
    synthetic = {16_000: [0.87, 0.93, 0.97, 0.988], 32_000: [0.83, 0.91, 0.955, 0.98], 100_000: [0.7, 0.8, 0.9, 0.95]}
    below, falls = calibration.verdicts(real, synthetic)
    assert "16,000, 32,000 rows the noisy copies' recall@3 is at or below real text's" in below
    assert "(at most 0.0700 lower)" in below
    assert "falls by 0.0150 on the noisy copies and 0.0100 on real text" in falls and "harder faster than" in falls
    synthetic[32_000][2] = 0.965  # now falls 0.005 per doubling, slower than real text
    assert "harder no faster than real text" in calibration.verdicts(real, synthetic)[1]
    synthetic[32_000][3] = 0.995
    below = calibration.verdicts(real, synthetic)[0]
    assert "NOT always below" in below and "do not bound real text's" in below


def test_the_wrapper_case_hands_the_server_its_flags_in_variables_the_wrapper_reads(tmp_path):
    """bench/retriever_load.py --wrapper: every RETRIEVER_* variable it sets is one of the wrapper's settings, and
    the wrapper, reading them as it does, starts the server on the benchmark's flags (plus the row's) and the URL
    the stand-in training searches."""
    import load_wrapper

    from slime_search_r1.launch.retriever_server import retrieval_bases, server_flags
    from slime_search_r1.settings.sources import read_environment
    from slime_search_r1.settings.table import WRAPPER, read_by

    settings = read_by(WRAPPER)
    flags = ["--index_path", str(tmp_path / "minilm_Flat.index"), "--corpus_path", str(tmp_path / "corpus.jsonl"),
             "--retriever_name", "minilm", "--retriever_model", str(tmp_path / "model"),
             "--max_length", "64"]  # fmt: skip
    caller = {"PATH": os.environ["PATH"], "TMUX": "/tmp/tmux-0/default,1,0", "RETRIEVER_ARGS": "--topk 9",
              "RETRIEVER_PRESET": "embedded", "SEARCH_BACKEND": "google"}  # fmt: skip
    rows = load_wrapper.wrapper_settings(SimpleNamespace(free_cpus=[0]))
    assert list(rows) == ["default", "RETRIEVER_ARGS with --num_threads 1", "RETRIEVER_CPUS=0"]
    for label, (more_flags, variables) in rows.items():
        env = load_wrapper.wrapper_env(flags + more_flags, variables, [sys.executable, "standin"], tmp_path, caller)
        unread = {name for name in env if name.startswith("RETRIEVER_")} - {setting.env for setting in settings}
        assert unread == set(), label
        assert "TMUX" not in env and "SEARCH_BACKEND" not in env  # the caller's session and backend stay out
        knobs, _ = read_environment(settings, env)
        assert server_flags(knobs) == flags + more_flags, label  # no preset, no --faiss_gpu, the caller's args gone
        assert (knobs.train_cmd, knobs.log_dir) == (f"{sys.executable} standin", str(tmp_path / "logs"))
        assert knobs.retriever_cpus == variables.get("RETRIEVER_CPUS")
        assert retrieval_bases(REPO / "generate_with_search.py", env) == [env["RETRIEVAL_SERVER_URL"]]


def test_the_tail_case_checks_its_three_figures_against_the_compared_server():
    """Busy p99/p50 and the ratio beside a max-size client are judged on this checkout's rounds (medians); idle QPS
    against the compared server's; one table holds all three per server and round."""

    def row(server: str, round_: int, busy_p99: float, beside_p99: float, idle_qps: float) -> load_tail.TailRow:
        return load_tail.TailRow(server, round_, "04:00", 1.2, idle_qps, 1000.0, busy_p99, 50.0, beside_p99, 3, 0)

    rows = [row("this", 1, 1400.0, 90.0, 300.0), row("compared", 1, 2000.0, 95.0, 310.0),
            row("this", 2, 1450.0, 80.0, 290.0), row("compared", 2, 2100.0, 85.0, 300.0)]  # fmt: skip
    targets = {target.split(" (")[0]: (result, met) for target, result, met in load_tail.tail_targets(rows)}
    assert targets["busy p99 <= 1.5x p50 at 256 clients"] == ("1.42", True)  # median of 1.40 and 1.45
    assert targets["single-query p99 beside a max-size client <= 2.0x alone"] == ("1.70x", True)
    assert targets["idle QPS at 256 clients no worse than the compared server's"] == ("295.0 vs 305.0 = 0.97", True)
    rows[0] = row("this", 1, 1600.0, 120.0, 200.0)
    rows[2] = row("this", 2, 1700.0, 110.0, 210.0)
    assert not any(met for _, _, met in load_tail.tail_targets(rows)[:2] + load_tail.tail_targets(rows)[3:])
    text = load_tail.render_tail(rows, load_tail.tail_targets(rows), [("this", None), ("compared", Path("/b"))], "x")
    assert "| this | 1 | 04:00 | 1.2 | 200.0 | 1000 / 1600 | 1.60 | 50 / 120 | 2.40x | 3 | 0 |" in text
    assert "`compared` = the server of /b" in text
