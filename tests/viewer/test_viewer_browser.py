"""The viewer's page in a real headless browser (Debian's chromium through Playwright), opened from disk as a user
opens it: it loads without errors or network, shows the dump's figures, filters and sorts its list, and draws a
sample's tokens with their loss-mask colours and values, the retrieved text always as text.

One browser for the module (on a thread of its own: tests/support/browser.py) and a fresh tab per test; every wait
is on a DOM condition the page sets (html[data-ready], html[data-sample-ready]), never on time. Skipped, saying what
to install, without chromium.
"""

import json

import numpy as np
import pytest

from slime_search_r1.training.collapse import CollapseWatch
from slime_search_r1.episode import episode_record, reward_of
from slime_search_r1.scoring.answers import em_check
from slime_search_r1.training.metrics import em_by_data_source, health_metrics, search_metrics, training_metrics
from slime_search_r1.viewer import build_page
from support.browser import launch_or_skip
from support.viewer_dumps import HOSTILE_TEXT, NEW_RECORD_KEY, NEW_RECORD_NAME, train_log_probs

TRAINED = {"rgb(200, 239, 200)", "rgb(179, 228, 179)"}  # --trained, --trained-alt
SHOWN = {"rgb(221, 227, 238)", "rgb(203, 211, 226)"}  # --shown, --shown-alt
THRESHOLD = 0.5


@pytest.fixture(scope="module")
def browser():
    browser = launch_or_skip()
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def page_file(viewer_dumps, tokenizer, tmp_path_factory):
    built = build_page(
        [viewer_dumps.folder], tmp_path_factory.mktemp("viewer"), tokenizer=tokenizer, threshold=THRESHOLD
    )
    return built.path


class Page:
    """One tab on the page, with what it logged."""

    def __init__(self, browser, path):
        self.tab = browser.new_tab(viewport={"width": 1400, "height": 1000})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.tab.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))
        self.tab.on("request", lambda r: self.requests.append(r.url))
        self.url = path.as_uri()
        self.tab.goto(self.url)
        self.tab.wait_for_selector("html[data-ready='1']", state="attached")

    def open(self, run: int, position: int) -> None:
        self.tab.evaluate(f"location.hash = '#run={run}&sample={position}'")
        self.tab.wait_for_selector(f"html[data-sample-ready='{run}-{position}']", state="attached")

    def rows(self) -> list[int]:
        return self.tab.eval_on_selector_all("#list tbody tr", "rows => rows.map(r => Number(r.dataset.pos))")

    def js(self, expression: str):
        return self.tab.evaluate(expression)

    def figures(self, kind: str) -> dict[str, float]:
        """The summary's figures of one table: the log hooks' ("hook") or the viewer's own ("viewer")."""
        return self.js(
            f"Object.fromEntries([...document.querySelectorAll('td[data-kind={kind}]')]"
            ".map(td => [td.dataset.metric, Number(td.dataset.value)]))"
        )

    def cells(self, column: str) -> list[str]:
        return self.js(f"[...document.querySelectorAll('#list td[data-col={column}]')].map(td => td.textContent)")


@pytest.fixture
def page(browser, page_file):
    page = Page(browser, page_file)
    yield page
    page.tab.close()


def position(dumps, name: str) -> int:
    return dumps.names.index(name)


def f32(value: float) -> float:
    return float(np.float32(value))


def test_the_page_loads_from_disk_and_opens_every_sample_without_an_error_or_a_request(page, viewer_dumps):
    assert page.js("document.title") == "Search-R1 trajectories"
    for run, samples in ((0, viewer_dumps.samples), (1, viewer_dumps.eval_samples)):
        for i in range(len(samples)):
            page.open(run, i)
    assert page.errors == []
    assert page.requests == [page.url]  # the page itself, nothing else: no CDN, no server


def test_the_summary_shows_the_log_hooks_figures_of_the_dump(page, viewer_dumps):
    shown = page.figures("hook")
    expected = search_metrics(viewer_dumps.samples) | health_metrics(viewer_dumps.samples)
    expected["health/alarms"] = len(CollapseWatch().observe(expected)[1])  # the page's first rollout: no changes yet
    assert shown == expected
    page.tab.click("nav#runs button[data-run='1']")
    page.tab.wait_for_selector("#run-name:text('eval 3')")
    shown = page.figures("hook")
    eval_samples = viewer_dumps.eval_samples
    expected = (
        search_metrics(eval_samples, training=False) | em_by_data_source(eval_samples) | health_metrics(eval_samples)
    )
    assert shown == expected
    assert "em_by_source/bamboogle" in shown
    assert page.rows() == [0, 1]


def test_filters_and_sort_change_the_list(page, viewer_dumps):
    samples = viewer_dumps.samples
    everyone = list(range(len(samples)))
    assert page.rows() == everyone
    assert page.js("document.getElementById('count').textContent") == f"{len(samples)} of {len(samples)} samples"

    def em(s):
        return s.metadata["search_r1"].get("reward", {}).get("em")

    page.tab.select_option("select[name=status]", "failed")
    assert (
        page.rows()
        == [i for i, s in enumerate(samples) if s.status.value == "failed"]
        == [position(viewer_dumps, "failed")]
    )
    page.tab.select_option("select[name=status]", "")
    page.tab.select_option("select[name=em]", "1")
    assert page.rows() == [i for i, s in enumerate(samples) if em(s) == 1.0]
    page.tab.select_option("select[name=em]", "unscored")
    assert page.rows() == [position(viewer_dumps, "aborted")]
    page.tab.select_option("select[name=em]", "")
    page.tab.select_option("select[name=source]", "hotpotqa")
    assert page.rows() == [i for i, s in enumerate(samples) if s.metadata["data_source"] == "hotpotqa"]
    page.tab.select_option("select[name=source]", "")
    page.tab.check("input[name=failedCall]")
    assert page.rows() == [position(viewer_dumps, "failed")]
    page.tab.uncheck("input[name=failedCall]")
    page.tab.check("input[name=truncated]")
    assert page.rows() == [position(viewer_dumps, "max turns")]
    page.tab.uncheck("input[name=truncated]")
    page.tab.fill("input[name=rewardMin]", "0.5")
    page.tab.fill("input[name=rewardMax]", "0.9")
    assert page.rows() == [i for i, s in enumerate(samples) if s.reward is not None and 0.5 <= s.reward <= 0.9]
    page.tab.fill("input[name=rewardMin]", "")
    page.tab.fill("input[name=rewardMax]", "")
    assert page.rows() == everyone

    page.tab.click("th[data-sort=reward]")  # ascending; a sample without a reward last
    by_reward = sorted(
        (i for i, s in enumerate(samples) if s.reward is not None), key=lambda i: (samples[i].reward, i)
    )
    assert page.rows() == by_reward + [position(viewer_dumps, "aborted")]
    page.tab.click("th[data-sort=len]")
    page.tab.click("th[data-sort=len]")  # descending
    assert page.rows() == sorted(everyone, key=lambda i: (-samples[i].response_length, -i))


def test_a_sample_shows_every_token_in_its_mask_colour_with_its_values(page, viewer_dumps):
    name = "right"
    sample = viewer_dumps.sample(name)
    page.open(0, position(viewer_dumps, name))
    tokens = page.js(
        "[...document.querySelectorAll('#sample-view span.t[data-i]')]"
        ".map(s => [Number(s.dataset.i), s.textContent, getComputedStyle(s).backgroundColor])"
    )
    assert [i for i, _, _ in tokens] == list(range(sample.response_length))
    assert "".join(text for _, text, _ in tokens) == sample.response
    for (i, _, colour), mask in zip(tokens, sample.loss_mask, strict=True):
        assert colour in (TRAINED if mask else SHOWN), (i, mask, colour)
    assert 0 in sample.loss_mask and 1 in sample.loss_mask

    train = train_log_probs(sample)
    prompt_length = len(sample.tokens) - sample.response_length
    for i in (0, sample.loss_mask.index(0), len(sample.loss_mask) - 1):
        page.tab.hover(f"#sample-view span.t[data-i='{i}']")
        page.tab.wait_for_selector(f".inspector td[data-field=position][data-value='{i}']", state="attached")
        values = page.js(
            "Object.fromEntries([...document.querySelectorAll('.inspector td[data-field]')]"
            ".map(td => [td.dataset.field, td.dataset.value]))"
        )
        assert int(values["id"]) == sample.tokens[prompt_length + i]
        assert int(values["loss_mask"]) == sample.loss_mask[i]
        assert float(values["rollout_log_probs"]) == f32(sample.rollout_log_probs[i])
        assert float(values["log_probs"]) == f32(train[i])
        assert float(values["ref_log_probs"]) == f32(sample.rollout_log_probs[i] - 0.01)
        assert float(values["advantages"]) == float(sample.index % 3) - 1.0
        assert float(values["entropy"]) == f32(0.5 + 0.01 * (i % 10))
        assert values["text"] == tokens[i][1]


def test_trained_tokens_whose_train_and_rollout_log_probs_differ_are_marked(page, viewer_dumps):
    name = "wrong"
    sample = viewer_dumps.sample(name)
    page.open(0, position(viewer_dumps, name))
    train = train_log_probs(sample)
    expected = [
        i
        for i, (t, r, m) in enumerate(zip(train, sample.rollout_log_probs, sample.loss_mask, strict=True))
        if m and abs(f32(t) - f32(r)) > THRESHOLD
    ]
    marked = "[...document.querySelectorAll('#sample-view span.t.gap')].map(s => Number(s.dataset.i))"
    assert page.js(marked) == expected
    assert len(expected) == 1
    page.tab.fill("input[name=threshold]", "2")
    assert page.js(marked) == []
    page.tab.fill("input[name=threshold]", "0.0005")
    assert len(page.js(marked)) > 1


def test_retrieved_markup_and_special_token_text_are_shown_as_text(page, viewer_dumps):
    name = "hostile"
    page.open(0, position(viewer_dumps, name))
    assert page.js("window.__pwned") is None
    assert page.js("document.querySelectorAll('#sample-view img, #sample-view b, #sample-view script').length") == 0
    assert HOSTILE_TEXT in page.js("document.querySelector('.call pre.result').textContent")
    shown = page.js("[...document.querySelectorAll('.tokens[data-step=shown]')].map(t => t.textContent).join('')")
    assert HOSTILE_TEXT in shown  # <|im_end|>, <script>, <img ...> as the passage wrote them
    # the passage's "<|im_end|>" is text in ordinary tokens, not the special token that ends a turn
    special = page.js("[...document.querySelectorAll('.tokens[data-step=shown] span.sp')].length")
    assert special == 0
    assert page.errors == []


def test_the_prompt_opens_as_tokens_and_a_chat_sample_as_messages(page, viewer_dumps):
    name = "chat"
    sample = viewer_dumps.sample(name)
    page.open(0, position(viewer_dumps, name))
    roles = page.js("[...document.querySelectorAll('[data-block=conversation] .message')].map(m => m.className)")
    assert roles == [f"message {r}" for r in ("system", "user", "assistant", "tool", "assistant")]
    call = page.js("document.querySelector('[data-block=conversation] .tool-call').textContent")
    assert call == '→ search({"query": "capital of France"})'
    page.tab.click("[data-block=prompt] > summary")
    page.tab.wait_for_selector("[data-block=prompt] span.t[data-p]")
    prompt = page.js("[...document.querySelectorAll('[data-block=prompt] span.t')].map(s => s.textContent).join('')")
    prompt_ids = sample.tokens[: len(sample.tokens) - sample.response_length]
    assert page.js("document.querySelectorAll('[data-block=prompt] span.t').length") == len(prompt_ids)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")

    xml = viewer_dumps.sample("right")
    page.open(0, position(viewer_dumps, "right"))
    page.tab.click("[data-block=prompt] > summary")
    page.tab.wait_for_selector("[data-block=prompt] span.t[data-p]")
    prompt = page.js("[...document.querySelectorAll('[data-block=prompt] span.t')].map(s => s.textContent).join('')")
    assert prompt == xml.prompt  # the chat-templated string slime built, token by token


def test_a_resumed_sample_marks_the_tokens_earlier_rollouts_sampled(page, viewer_dumps):
    """--partial-rollout: the response tokens before the resume point are underlined and the inspector says so."""
    name = "resumed"
    sample = viewer_dumps.sample(name)
    resumed_at = sample.metadata["search_r1"]["resumed_at"][-1]
    page.open(0, position(viewer_dumps, name))
    earlier = page.js("[...document.querySelectorAll('#sample-view span.t.earlier')].map(s => Number(s.dataset.i))")
    assert earlier == list(range(resumed_at))
    assert 0 < resumed_at < sample.response_length
    badge = page.js("document.querySelector('.badge[data-field=resumes]').textContent")
    assert badge.startswith("resumed 1× (partial rollout)")
    for i, expected in ((resumed_at - 1, "1"), (resumed_at, "0")):
        page.tab.hover(f"#sample-view span.t[data-i='{i}']")
        page.tab.wait_for_selector(f".inspector td[data-field=position][data-value='{i}']", state="attached")
        assert page.js("document.querySelector('.inspector td[data-field=earlier]').dataset.value") == expected
    page.open(0, position(viewer_dumps, "right"))  # a sample never aborted: no marks, no row
    assert page.js("document.querySelectorAll('#sample-view span.t.earlier').length") == 0
    assert page.js("document.querySelector('.badge[data-field=resumes]')") is None


def test_record_keys_the_viewer_does_not_know_are_shown(page, viewer_dumps):
    page.open(0, position(viewer_dumps, "wrong"))
    summary = page.js("document.querySelector('[data-block=record-more] summary').textContent")
    assert summary == f"record: {NEW_RECORD_NAME}"
    assert json.loads(page.js("document.querySelector('[data-block=record-more] pre').textContent")) == NEW_RECORD_KEY
    assert page.js("document.querySelectorAll('[data-block=record-more]').length") == 1  # the long-horizon keys: drawn
    cells = page.js(
        "Object.fromEntries([...document.querySelectorAll('td[data-counter]')]"
        ".map(c => [c.dataset.counter, c.textContent]))"
    )
    assert cells["forced_answer"] == "inject on turn 3 (max_turns), 18 instruction tokens"
    assert cells["page_chunks"] == "2"


@pytest.fixture(scope="module")
def evaluate_page(viewer_dumps, tokenizer, tmp_path_factory):
    """An evaluate.py --viewer output folder: its lines written by evaluate.py's own trajectory_record."""
    from slime_search_r1.evaluation.dataset import EvalRow
    from slime_search_r1.evaluation.runner import trajectory_record

    folder = tmp_path_factory.mktemp("evaluate_run")
    with (folder / "trajectories.jsonl").open("w", encoding="utf-8") as lines:
        for i, sample in enumerate(viewer_dumps.eval_samples):
            row = EvalRow(index=i, data_source=sample.metadata["data_source"], row={"question": f"q{i}"})
            record = trajectory_record(row, sample, sample.reward, 0.1, with_tokens=True)
            lines.write(json.dumps(record) + "\n")
    return folder, build_page([folder], folder / "viewer", tokenizer=tokenizer).path


def test_an_evaluate_run_shows_its_trajectories_token_by_token(browser, evaluate_page, viewer_dumps):
    folder, path = evaluate_page
    page = Page(browser, path)
    try:
        assert page.js("document.getElementById('run-name').textContent") == f"evaluate {folder.name}"
        assert page.rows() == [0, 1]
        page.tab.select_option("select[name=source]", "bamboogle")
        assert page.rows() == [1]
        for i, sample in enumerate(viewer_dumps.eval_samples):
            page.open(0, i)
            text = page.js("[...document.querySelectorAll('#sample-view span.t[data-i]')].map(s => s.textContent)")
            assert "".join(text) == sample.response
            masks = page.js("[...document.querySelectorAll('#sample-view span.t[data-i]')].map(s => s.classList[1])")
            assert masks == ["m1" if m else "m0" for m in sample.loss_mask]
        assert page.errors == []
    finally:
        page.tab.close()


def test_tokens_of_two_weight_versions_are_marked_by_version_and_their_spans_head_the_sample(page, viewer_dumps):
    """The resumed sample's second turn is two engine calls, before and after a weight update: each token carries
    the colour of the version that sampled it, observations none, and the header lists each version's spans."""
    name = "resumed"
    spans = viewer_dumps.sample(name).metadata["search_r1"]["versions"]
    assert [version for *_, version in spans] == ["1", "1", "2"]
    page.open(0, position(viewer_dumps, name))
    badges = page.js(
        "[...document.querySelectorAll('.badge[data-field=version]')].map(b => [b.dataset.version, b.textContent])"
    )
    (a, b, _), (c, d, _), (e, f, _) = spans
    assert badges == [
        ["1", f"version 1 (1 behind): tokens {a}–{b - 1}, {c}–{d - 1}"],
        ["2", f"version 2: tokens {e}–{f - 1}"],
    ]
    for k, version in enumerate(["1", "2"]):
        marked = page.js(f"[...document.querySelectorAll('#sample-view span.t.v{k}')].map(s => Number(s.dataset.i))")
        assert marked == [i for start, end, v in spans if v == version for i in range(start, end)]
    bar = page.js("getComputedStyle(document.querySelector('#sample-view span.t.v1')).boxShadow")
    assert bar.startswith("rgb(230, 159, 0)")  # the second colour of the palette, under each token
    for i, expected in ((a, "1"), (d - 1, "1"), (e, "2"), (b, "")):  # b: the first token of the search results
        page.tab.hover(f"#sample-view span.t[data-i='{i}']")
        page.tab.wait_for_selector(f".inspector td[data-field=position][data-value='{i}']", state="attached")
        assert page.js("document.querySelector('.inspector td[data-field=version]').dataset.value") == expected
    page.open(0, position(viewer_dumps, "right"))  # one version: its spans in the header, no marks on the tokens
    assert page.js("document.querySelectorAll('.badge[data-field=version]').length") == 1
    assert page.js("document.querySelectorAll('#sample-view span.t.v0').length") == 0
    assert page.errors == []


# What each training episode answered (tests/support/viewer_dumps.py's scripts); None: no answer.
ANSWERS = {"right": "Paris", "wrong": "Berlin", "invalid then right": "Paris", "max turns": None, "hostile": "Paris",
           "multibyte": "Paris", "chat": "Paris", "chat malformed": "Paris", "failed": None, "aborted": None,
           "resumed": "Paris"}  # fmt: skip


def shown_answer(answer: str | None) -> str:
    return "(none)" if answer is None else answer


def test_each_sample_shows_its_answer_beside_its_gold_answers_in_the_list_and_the_reward_panel(
    page, browser, evaluate_page, viewer_dumps
):
    """The answer shown is the one the reward scored: its exact match with the gold answers is the reward's em."""
    assert page.cells("answer") == [shown_answer(ANSWERS[name]) for name in viewer_dumps.names]
    assert page.cells("answers") == ["Paris"] * len(viewer_dumps.names)
    for name, sample in zip(viewer_dumps.names, viewer_dumps.samples, strict=True):
        reward = reward_of(episode_record(sample))
        if reward is not None:
            assert reward["em"] == float(ANSWERS[name] is not None and em_check(ANSWERS[name], ["Paris"])), name
    page.tab.fill("input[name=text]", "berlin")  # the search box finds answers too
    assert page.rows() == [position(viewer_dumps, "wrong")]
    for name in ("wrong", "max turns", "chat"):
        page.open(0, position(viewer_dumps, name))
        panel = page.js(
            "Object.fromEntries([...document.querySelectorAll('td[data-reward]')]"
            ".map(td => [td.dataset.reward, td.textContent]))"
        )
        assert (panel["answer"], panel["gold"]) == (shown_answer(ANSWERS[name]), "Paris"), name
    _, path = evaluate_page  # evaluate.py's lines: the answer it wrote
    evaluation = Page(browser, path)
    try:
        assert evaluation.cells("answer") == ["Paris", "Paris"]
        evaluation.open(0, 1)
        assert evaluation.js("document.querySelector('td[data-reward=answer]').textContent") == "Paris"
    finally:
        evaluation.tab.close()


def training_only(samples) -> set[str]:
    """The figures the hooks give only for training (training/metrics.py's training_metrics) of these samples."""
    pairs = [(sample, episode_record(sample)) for sample in samples]
    return set(training_metrics(pairs, [record for _, record in pairs]))


def test_an_evaluation_shows_no_training_only_figure_or_control_and_a_training_rollout_does(
    page, browser, evaluate_page, viewer_dumps
):
    """Training's own figures (engine aborts and restarts, weight versions, resumes, splits; the GRPO groups) and the
    train dump's controls (the log-prob gap column and threshold, the weight versions) show for a training rollout
    with its train dump, and not for its evaluation nor for an evaluate.py run; the sample list is in sight."""
    rollout_only = training_only(viewer_dumps.samples)
    assert {"engine_aborts/mean", "restarted_share", "versions/lag/max", "resumed_samples"} <= rollout_only
    assert rollout_only <= set(page.figures("hook"))
    assert "groups/zero_spread_share" in page.figures("viewer")
    assert page.js("document.querySelectorAll('th[data-sort=gap]').length") == 1
    page.open(0, position(viewer_dumps, "resumed"))
    assert page.js("document.querySelectorAll('input[name=threshold], .badge[data-field=version]').length") == 3

    _, path = evaluate_page
    evaluation = Page(browser, path)
    eval_only = training_only(viewer_dumps.eval_samples)
    assert {"engine_aborts/mean", "restarted_share", "versions/newest", "versions/lag/max"} <= eval_only
    try:
        for tab, run in ((page, 1), (evaluation, 0)):
            tab.tab.evaluate(f"location.hash = '#run={run}'")
            tab.tab.wait_for_selector(f"nav#runs button.current[data-run='{run}']", state="attached")
            assert eval_only.isdisjoint(tab.figures("hook"))
            assert "groups/zero_spread_share" not in tab.figures("viewer")
            assert tab.js("document.querySelectorAll('th[data-sort=gap], td[data-col=gap]').length") == 0
            first = tab.js("document.querySelector('#list tbody tr').getBoundingClientRect().bottom")
            assert first <= tab.js("window.innerHeight")  # the list opens in sight, not under the figures
            for position_ in range(len(viewer_dumps.eval_samples)):
                tab.open(run, position_)
                assert tab.js("document.querySelectorAll('input[name=threshold], [data-control=gap]').length") == 0
                assert tab.js("document.querySelectorAll('.badge[data-field=version]').length") == 0
        assert evaluation.errors == []
    finally:
        evaluation.tab.close()
