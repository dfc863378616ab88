"""evaluate.py's charts: EM per data source as a bar chart, and `evaluate.py compare` across checkpoints.

The results.json files are written here by the evaluation's own summarize + write_reports, as evaluate.py writes them.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

import evaluate
from slime_search_r1.data import SEARCH_R1_DATA_SOURCES
from slime_search_r1.evaluation.chart import em_bar_figure
from slime_search_r1.evaluation.comparison import comparison_figure, load_results
from slime_search_r1.evaluation.references import beside_paper, load_reference, shipped
from slime_search_r1.evaluation.reports import references_markdown, write_reports
from slime_search_r1.evaluation.summary import pass_at_k, summarize

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def records(ems: dict[str, list[float]]) -> list[dict]:
    return [
        {"data_source": source, "em": em, "status": "completed", "searches": 1, "turns": 2}
        for source, values in ems.items()
        for em in values
    ]


def write_run(folder: Path, ems: dict[str, list[float]], *, selected=None, **settings) -> Path:
    """An evaluate.py output folder whose trajectories scored `ems` per data source."""
    folder.mkdir(parents=True)
    summary = summarize(records(ems), selected or {source: len(values) for source, values in ems.items()})
    config = {"hf_checkpoint": f"/ckpt/{folder.name}", "data": "/data/test.parquet", "temperature": 0.0, **settings}
    write_reports(folder, summary, config)
    return folder


@pytest.fixture
def checkpoints(tmp_path):
    return [
        write_run(tmp_path / "step_100", {"nq": [0.0, 1.0], "hotpotqa": [0.0, 0.0]}),
        write_run(tmp_path / "step_200", {"nq": [1.0, 1.0], "hotpotqa": [0.0, 1.0]}),
        write_run(tmp_path / "step_300", {"nq": [1.0, 1.0], "hotpotqa": [1.0, 1.0], "bamboogle": [0.0]}),
    ]


def test_the_bar_chart_shows_em_per_source_then_the_average(tmp_path):
    summary = summarize(records({"hotpotqa": [1.0, 0.0], "nq": [1.0, 1.0, 0.0, 0.0]}), {"nq": 4, "hotpotqa": 2})
    axes = em_bar_figure(summary, "model").axes[0]
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["nq", "hotpotqa", "average"]
    assert [bar.get_height() for bar in axes.patches] == [0.5, 0.5, 0.5]
    assert [text.get_text() for text in axes.texts] == ["0.500", "0.500", "0.500"]


def test_a_source_not_run_yet_is_marked_with_a_dash():
    summary = summarize(records({"nq": [1.0]}), {"nq": 1, "hotpotqa": 3})
    axes = em_bar_figure(summary, "model").axes[0]
    assert [bar.get_height() for bar in axes.patches] == [1.0, 0.0, 1.0]
    assert [text.get_text() for text in axes.texts] == ["1.000", "-", "1.000"]


def test_compare_writes_a_table_and_a_line_chart_in_checkpoint_order(checkpoints, tmp_path):
    out = tmp_path / "comparison"
    assert evaluate.main(["compare", *map(str, checkpoints), "--output", str(out)]) == 0

    table = (out / "comparison.md").read_text().splitlines()
    assert "| checkpoint | nq | hotpotqa | bamboogle | **average** | trajectories |" in table
    assert "| step_100 | 0.500 | 0.000 | - | **0.250** | 4 of 4 |" in table
    assert "| step_200 | 1.000 | 0.500 | - | **0.750** | 4 of 4 |" in table
    assert "| step_300 | 1.000 | 1.000 | 0.000 | **0.667** | 5 of 5 |" in table
    assert "- step_300: `/ckpt/step_300`" in table
    assert not any("Warning" in line for line in table)

    image = matplotlib.image.imread(out / "comparison.png")
    assert image.ndim == 3
    assert image.shape[0] > 100
    assert image.shape[1] > 100


def test_the_line_chart_has_one_line_per_source_and_the_average(checkpoints):
    runs = [load_results(folder) for folder in checkpoints]
    axes = comparison_figure(["a", "b", "c"], runs).axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in axes.get_lines()}
    assert lines["nq"] == [0.5, 1.0, 1.0]
    assert lines["hotpotqa"] == [0.0, 0.5, 1.0]
    assert [math.isnan(em) for em in lines["bamboogle"]] == [True, True, False]  # no point before step 300
    assert lines["bamboogle"][2] == 0.0
    assert lines["average"] == pytest.approx([0.25, 0.75, 2 / 3])
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["a", "b", "c"]


def test_labels_name_the_runs_and_different_settings_are_flagged(tmp_path):
    runs = [
        write_run(tmp_path / "x" / "eval", {"nq": [1.0]}),
        write_run(tmp_path / "y" / "eval", {"nq": [0.0]}, temperature=0.7),
    ]
    out = tmp_path / "cmp"
    assert evaluate.main(["compare", *map(str, runs), "--output", str(out), "--labels", "base, tuned"]) == 0
    table = (out / "comparison.md").read_text()
    assert "| base | 1.000 |" in table
    assert "| tuned | 0.000 |" in table
    assert "different settings: temperature (0.0, 0.7)" in table


def test_an_incomplete_run_is_marked(tmp_path):
    run = write_run(tmp_path / "partial", {"nq": [1.0]}, selected={"nq": 3})
    out = tmp_path / "cmp"
    assert evaluate.main(["compare", str(run), "--output", str(out)]) == 0
    assert "| partial | 1.000 | **1.000** | 1 of 3 (incomplete) |" in (out / "comparison.md").read_text()


def test_compare_input_errors_are_reported(checkpoints, tmp_path, capsys):
    out = str(tmp_path / "cmp")
    assert evaluate.main(["compare", str(checkpoints[0]), str(tmp_path / "nowhere"), "--output", out]) == 2
    assert f"{tmp_path / 'nowhere' / 'results.json'} not found" in capsys.readouterr().err

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{not json")
    assert evaluate.main(["compare", str(tmp_path / "broken"), "--output", out]) == 2
    assert "results.json is not valid JSON" in capsys.readouterr().err

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text(json.dumps({"accuracy": 0.5}))
    assert evaluate.main(["compare", str(tmp_path / "other"), "--output", out]) == 2
    assert "has no EM per data source" in capsys.readouterr().err

    twins = [write_run(tmp_path / side / "eval", {"nq": [1.0]}) for side in ("left", "right")]
    with pytest.raises(SystemExit):
        evaluate.main(["compare", *map(str, twins), "--output", out])
    assert "name the runs with --labels" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["compare", *map(str, twins), "--output", out, "--labels", "only-one"])
    assert "--labels needs 2 non-empty comma-separated names, got 1" in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()  # nothing written on bad input


def test_without_matplotlib_the_table_is_still_written(checkpoints, tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` now raises ImportError
    out = tmp_path / "cmp"
    assert evaluate.main(["compare", *map(str, checkpoints), "--output", str(out)]) == 0
    assert (out / "comparison.md").exists()
    assert not (out / "comparison.png").exists()
    err = capsys.readouterr().err
    assert "no chart" in err
    assert "pip install matplotlib" in err


def test_compare_help_runs_as_a_script():
    result = subprocess.run(
        [sys.executable, str(REPO / "evaluate.py"), "compare", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "--labels" in result.stdout
    assert "comparison.png" in result.stdout


def scored_records(source: str, scores: list[tuple[float, float, float, float | None]]) -> list[dict]:
    """One trajectory per (em, f1, cover_em, judge) of `source`; judge None is a marked (unjudged) sample."""
    return [
        {
            "data_source": source,
            "index": i,
            "key": f"{source}{i}",
            "status": "completed",
            "em": em,
            "f1": f1,
            "cover_em": cover,
            "judge": judge,
            "searches": 1,
            "turns": 2,
        }
        for i, (em, f1, cover, judge) in enumerate(scores)
    ]


JUDGE = {"model": "judge-7b", "prompt_sha256": "0" * 64, "url": "http://127.0.0.1:8000/v1/chat/completions"}


def test_every_score_is_summarised_and_a_marked_sample_is_left_out_of_the_judge_s(tmp_path):
    records = scored_records("nq", [(1.0, 1.0, 1.0, 1.0), (0.0, 0.5, 1.0, None)]) + scored_records(
        "hotpotqa", [(0.0, 0.0, 0.0, 0.0)]
    )
    summary = summarize(records, {"nq": 2, "hotpotqa": 1}, judge=JUDGE)
    assert summary["scores"] == ["em", "f1", "cover_em", "judge"]
    nq = summary["data_sources"]["nq"]
    assert (nq["em"], nq["f1"], nq["cover_em"], nq["judge"], nq["unjudged"]) == (0.5, 0.75, 1.0, 1.0, 1)
    assert summary["average_judge"] == 0.5  # mean of nq's 1.0 (its one judged sample) and hotpotqa's 0.0
    assert summary["unjudged"] == 1

    axes = em_bar_figure(summary, "model").axes[0]
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["nq", "hotpotqa", "average"]
    assert len(axes.patches) == 4 * 3  # four scores, three groups
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["EM", "F1", "cover EM", "judge"]
    write_reports(tmp_path, summary, {"hf_checkpoint": "/ckpt/m", "temperature": 0.0})
    markdown = (tmp_path / "results.md").read_text()
    assert "| nq | 2 | 0.500 | 0.750 | 1.000 | 1.000 | 1.00 | 2.00 | 0 | 1 |" in markdown
    assert "1 trajectories unjudged" in markdown


def test_compare_shows_every_score_a_run_has(tmp_path):
    runs = []
    for name, judge in (("step_100", 0.0), ("step_200", 1.0)):
        folder = tmp_path / name
        folder.mkdir()
        summary = summarize(scored_records("nq", [(0.0, 0.5, 1.0, judge)]), {"nq": 1}, judge=JUDGE)
        write_reports(folder, summary, {"hf_checkpoint": f"/ckpt/{name}", "temperature": 0.0})
        runs.append(folder)
    em_only = write_run(tmp_path / "step_50", {"nq": [0.0]})  # a results.json with EM alone
    out = tmp_path / "cmp"
    assert evaluate.main(["compare", str(em_only), *map(str, runs), "--output", str(out)]) == 0
    table = (out / "comparison.md").read_text()
    for heading in ("## EM", "## F1", "## cover EM", "## judge"):
        assert heading in table
    f1_table = table.split("## F1", 1)[1].split("##", 1)[0]
    assert "| step_50 | - | **-** | 1 of 1 |" in f1_table
    assert "| step_200 | 0.500 | **0.500** | 1 of 1 |" in f1_table
    judge_table = table.split("## judge", 1)[1]
    assert "| step_100 | 0.000 | **0.000** | 1 of 1 |" in judge_table
    assert "| step_200 | 1.000 | **1.000** | 1 of 1 |" in judge_table

    figure = comparison_figure(["a", "b", "c"], [load_results(folder) for folder in (em_only, *runs)])
    assert [axes.get_title() for axes in figure.axes] == [
        f"{name} per data source across checkpoints" for name in ("EM", "F1", "cover EM", "judge")
    ]
    judge_lines = {line.get_label(): list(line.get_ydata()) for line in figure.axes[3].get_lines()}
    assert math.isnan(judge_lines["nq"][0]) and judge_lines["nq"][1:] == [0.0, 1.0]


@pytest.mark.parametrize("name", shipped())
def test_every_shipped_table_loads_and_names_its_paper_table_and_version(name):
    reference = load_reference(name)
    assert "arXiv" in reference.source and reference.table
    assert set(reference.scores) <= {"em", "f1", "cover_em", "judge"}
    for score, average in reference.averages.items():  # a transcription slip shows in the paper's own average
        figures = list(reference.scores[score].values())
        assert sum(figures) / len(figures) == pytest.approx(average, abs=0.0015), score


def test_two_papers_beyond_search_r1_give_f1_or_judge_on_the_seven_sources():
    papers = {
        load_reference(name).source.split(" (")[0]
        for name in shipped()
        if any(
            set(load_reference(name).scores.get(score, {})) == set(SEARCH_R1_DATA_SOURCES) for score in ("f1", "judge")
        )
    }
    assert {"ASearcher", "DeepResearcher"} <= papers


def sampled(index: int, ems: list[float]) -> list[dict]:
    """The samples of one nq question, one record per EM (None: a sample without the score)."""
    return [
        {"data_source": "nq", "index": index, "key": f"{index}#{i}", "status": "completed", "em": em, "searches": 1}
        for i, em in enumerate(ems)
    ]


def test_pass_at_k_is_the_unbiased_estimator_over_n_samples_and_needs_k_of_them(tmp_path):
    # 8 samples, 1 right: of the 70 ways to draw 4, 35 hold it; the best of all 8 (1.0) would be pass@8
    records = sampled(0, [1.0] + [0.0] * 7) + sampled(1, [1.0, 1.0, 1.0])  # the second has 3 of 4: no pass@4
    summary = summarize(records, {"nq": 12}, samples_per_question=4)
    nq = summary["data_sources"]["nq"]
    assert (nq["em_pass@4"], nq["em_pass@4_short"], summary["em_pass@4_short"]) == (0.5, 1, 1)
    assert nq["em"] == pytest.approx((1 / 8 + 1.0) / 2)  # avg@4 keeps the mean of what each question has
    write_reports(tmp_path, summary, {"hf_checkpoint": "/ckpt/m", "temperature": 0.7})
    markdown = (tmp_path / "results.md").read_text()
    assert "**Left out of pass@4:** questions with fewer than 4 scored samples" in markdown
    assert "incomplete): EM pass@4 1." in markdown


def test_pass_at_k_agrees_with_chen_et_al_for_0_1_scores_and_is_the_best_at_n_equal_k():
    for n in range(1, 9):
        for right in range(n + 1):
            values = [1.0] * right + [0.0] * (n - right)
            for k in range(1, n + 1):
                chen = 1 - math.comb(n - right, k) / math.comb(n, k)
                assert pass_at_k(values, k) == pytest.approx(chen), (n, right, k)
            assert pass_at_k(values, n + 1) is None
    f1s = [0.2, 0.9, 0.5]
    assert pass_at_k(f1s, 3) == pytest.approx(0.9)
    assert pass_at_k(f1s, 1) == pytest.approx(sum(f1s) / 3)
    assert pass_at_k(f1s, 2) == pytest.approx((0.5 + 0.9 + 0.9) / 3)  # the best of each pair


def test_the_chart_draws_the_paper_s_bars_beside_the_run_s():
    summary = summarize(records({"nq": [1.0, 0.0], "hotpotqa": [0.0]}), {"nq": 2, "hotpotqa": 1})
    comparisons = beside_paper(summary, load_reference("search-r1-base-grpo"))
    axes = em_bar_figure(summary, "model", comparisons).axes[0]
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["EM", "paper: EM"]
    heights = [patch.get_height() for patch in axes.patches]
    assert heights == pytest.approx([0.5, 0.0, 0.25, 0.421, 0.297, (0.421 + 0.297) / 2])
    assert [patch.get_hatch() for patch in axes.patches] == [None] * 3 + ["//"] * 3


def test_the_paper_table_says_which_sources_have_few_questions():
    summary = summarize(records({"nq": [1.0] * 100, "hotpotqa": [0.0] * 99}), {"nq": 100, "hotpotqa": 99})
    markdown = references_markdown(beside_paper(summary, load_reference("search-r1-base-grpo")))
    assert "- **few questions** (under 100): hotpotqa 99 (±0.10). A score over n questions" in markdown
    assert "nq 100" not in markdown
