"""The page draws what the reward and the early warnings leave: a rollout's collapse warnings under its figures, and
a sample's reward card with the score it was built on and the judge's verdict (a sample the judge left unscored is
marked). In a real headless browser, as test_viewer_browser.py; skipped, saying what to install, without chromium."""

import pytest

from slime_search_r1.viewer.page import render_page, write_page
from slime_search_r1.viewer.samples import Run, ViewSample
from support.browser import launch_or_skip

LOOP = [11, 12, 13, 14, 15, 16] * 10  # a six-token sentence, ten times: the repetition signal leaves its band


def judged(position: int, verdict: dict, score: float, ids: list[int]) -> ViewSample:
    reward = {"score": score, "em": 1.0, "format_valid": 1.0, "retrieval_hit": 0.0, "judge": verdict["score"] or 0.0}
    reward |= {"scored_by": "judge", "judge_verdict": verdict}
    if verdict["score"] is None:
        reward["unscored"] = True
    record = {"finish_reason": "answer", "turns": 1, "tools": {}, "reward": reward}
    return ViewSample(
        position=position,
        status="completed",
        prompt="Question: What is the capital of France?",
        response="<think>It is Paris.</think><answer> Paris </answer>",
        response_length=len(ids),
        metadata={"search_r1": record},
        reward=score,
        group_index=0,
        remove_sample=verdict["score"] is None,
        response_ids=ids,
        loss_mask=[1] * len(ids),
        rollout_log_probs=[-0.5] * len(ids),
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    unjudged = {"status": "error", "score": None, "reply": None, "error": "HTTP 503: down", "attempts": 4}
    reply = "It says Paris.\nVerdict: correct"
    correct = {"status": "correct", "score": 1.0, "reply": reply, "error": None, "attempts": 1}
    samples = [judged(0, unjudged, 1.0, LOOP), judged(1, correct, 1.0, [1, 2, 3])]
    run = Run("rollout 7", "rollout", "constructed", samples, 7)
    path = write_page(tmp_path_factory.mktemp("viewer"), render_page([run]))
    browser = launch_or_skip()
    tab = browser.new_tab(viewport={"width": 1400, "height": 1000})
    errors = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(path.as_uri())
    tab.wait_for_selector("html[data-ready='1']", state="attached")
    yield tab, errors
    browser.close()


def open_sample(tab, position: int) -> None:
    tab.evaluate(f"location.hash = '#run=0&sample={position}'")
    tab.wait_for_selector(f"html[data-sample-ready='0-{position}']", state="attached")


def text(tab, selector: str) -> str:
    return tab.eval_on_selector(selector, "node => node.textContent")


def test_a_rollout_shows_its_collapse_warnings_under_its_figures(page):
    tab, errors = page
    alarms = tab.eval_on_selector_all("#summary [data-alarm]", "nodes => nodes.map(n => n.textContent)")
    assert alarms == [
        "collapse warning: health/repetition_share = 0.5 is above its healthy band (at most 0.05): responses loop on "
        "the same tokens: lower the learning rate, check the TIS settings; a format bonus earned without an answer "
        "(well_formed_wrong_share) can feed it"
    ]
    assert errors == []


def test_a_sample_the_judge_left_unscored_shows_why(page):
    tab, errors = page
    open_sample(tab, 0)
    assert text(tab, "[data-field=unscored]") == "the judge gave no verdict: unscored, kept out of training"
    assert text(tab, "td[data-reward=scored_by]") == "judge"
    assert text(tab, "td[data-reward=judge_verdict]") == "error; 4 requests; HTTP 503: down"
    assert errors == []


def test_a_judged_sample_shows_the_verdict_and_the_judge_s_reply(page):
    tab, errors = page
    open_sample(tab, 1)
    assert tab.query_selector("[data-field=unscored]") is None
    assert text(tab, "td[data-reward=judge]") == "1"
    assert text(tab, "td[data-reward=judge_verdict]") == "correct; 1 request"
    assert "Verdict: correct" in text(tab, "td.reply")
    assert errors == []
