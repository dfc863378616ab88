"""How fast the viewer's page opens and answers for a full rollout batch: 256 samples with 8k-token responses.

Writes slime dumps the way slime writes them (Sample.to_dict through save_debug_rollout_data, the train side through
its format-2 payload builder; the stand-in's unless slime is on the path), with real Qwen2.5 token ids (the offline
tokenizer the tests build), builds the page with the viewer's command-line code, then opens it from disk in headless
chromium (Playwright) and reads the browser's own clocks:

  ready       navigation start -> the summary and the sample list drawn (the page's "viewer-ready" mark)
  DOM loaded  navigation start -> DOMContentLoaded (every sample's data block parsed)
  load        navigation start -> the load event
  open        a sample's hash set -> its 8k tokens drawn, laid out and painted (the next frame)
  hover       one token's values into the inspector, laid out
  filter      the status filter changed -> the list redrawn, laid out

Each browser figure is the median of --repeats page loads (a fresh tab each). Target: open < 3 s.

    .venv/bin/python bench/viewer_page.py [--samples 256 --tokens 8192 --repeats 3] [--write-results]
"""

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "slime_stub"), str(ROOT / "tests")]

TARGET_OPEN_S = 3.0
WORDS = (
    "the of and in to a was is for on as by with he at from that his it an were are which this also be has or had "
    "first one their its new after who they two her she been other when there all during into school time may "
    "years more most only over city some world would where later up such used many can state about national out "
    "known university united then made Paris France capital river population century war government north south"
).split()


def text_of(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def make_samples(tokenizer, count: int, tokens: int, seed: int = 0):
    """`count` XML-mode samples of about `tokens` response tokens: turns of ~400 model tokens and ~500 retrieved."""
    from slime.utils.types import Sample

    rng = random.Random(seed)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Answer the given question. Question: " + text_of(rng, 12) + "?\n"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    samples = []
    for index in range(count):
        ids, mask, log_probs, turns = [], [], [], 0
        while len(ids) < tokens:
            turn = tokenizer.encode(
                f"<think>{text_of(rng, 280)}</think>\n<search> {text_of(rng, 6)} </search>", add_special_tokens=False
            )
            shown = tokenizer.encode(
                f"\n\n<information>Doc 1(Title: {text_of(rng, 3)}) {text_of(rng, 360)}</information>\n\n",
                add_special_tokens=False,
            )
            ids += turn + shown
            mask += [1] * len(turn) + [0] * len(shown)
            log_probs += [-rng.expovariate(2.0) for _ in turn] + [0.0] * len(shown)
            turns += 1
        ids, mask, log_probs = ids[:tokens], mask[:tokens], log_probs[:tokens]
        sample = Sample(
            index=index,
            group_index=index // 8,
            prompt=prompt,
            tokens=prompt_ids + ids,
            response=tokenizer.decode(ids),
            response_length=len(ids),
            label={"ground_truth": {"target": ["Paris"]}},
            loss_mask=mask,
            rollout_log_probs=log_probs,
            status=Sample.Status.TRUNCATED,
            metadata={"data_source": rng.choice(["nq", "hotpotqa"])},
        )
        em = float(rng.random() < 0.4)
        sample.reward = em
        sample.metadata["search_r1"] = {
            "turns": turns,
            "invalid_actions": 0,
            "observation_tokens": mask.count(0),
            "truncated_observations": 0,
            "tools": {"search": {"calls": turns, "failures": 0, "seconds": [0.05] * turns}},
            "tool_error": None,
            "finish_reason": "token_budget",
            "evaluation": False,
            "reward": {"score": em, "em": em, "format_valid": 1.0, "retrieval_hit": em},
        }
        samples.append(sample)
    return samples


def write_dumps(folder: Path, samples, with_train: bool) -> None:
    import torch
    from slime.observability.rollout_data_utils import save_debug_rollout_data
    from slime.observability.train_data_utils import _build_dump_payload

    save_debug_rollout_data(str(folder / "rollout_data" / "{rollout_id}.pt"), samples, rollout_id=0, evaluation=False)
    if not with_train:
        return
    rng = random.Random(1)
    data = {
        "partition": list(range(len(samples))),
        "tokens": [torch.tensor(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [torch.tensor(s.loss_mask, dtype=torch.int) for s in samples],
        "rollout_log_probs": [torch.tensor(s.rollout_log_probs) for s in samples],
        "log_probs": [torch.tensor([v + rng.gauss(0, 0.05) for v in s.rollout_log_probs]) for s in samples],
        "ref_log_probs": [torch.tensor([v + rng.gauss(0, 0.1) for v in s.rollout_log_probs]) for s in samples],
        "advantages": [torch.full((s.response_length,), rng.gauss(0, 1)) for s in samples],
        "entropy": [torch.rand(s.response_length) for s in samples],
    }
    shard = {"rank": 0, "data_parallel_rank": 0, "rollout_data": data}
    (folder / "train_data").mkdir(parents=True)
    torch.save(_build_dump_payload([shard], rollout_id=0, writer_rank=0), folder / "train_data" / "0.pt")


MEASURE_OPEN = """async (position) => {
  const t0 = performance.now();
  const ready = new Promise((resolve) => {
    const done = () => document.documentElement.dataset.sampleReady === `0-${position}`;
    if (done()) return resolve();
    new MutationObserver((_, observer) => { if (done()) { observer.disconnect(); resolve(); } })
      .observe(document.documentElement, { attributes: true });
  });
  location.hash = `#run=0&sample=${position}`;
  await ready;
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));  // painted
  return [performance.now() - t0, document.querySelectorAll('#sample-view span.t[data-i]').length];
}"""
MEASURE_HOVER = """() => {
  const spans = document.querySelectorAll('#sample-view span.t[data-i]');
  const span = spans[Math.floor(spans.length / 2)];
  const t0 = performance.now();
  span.dispatchEvent(new MouseEvent('mouseover', { bubbles: true }));
  document.querySelector('.inspector').getBoundingClientRect();
  return performance.now() - t0;
}"""
MEASURE_FILTER = """() => {
  const select = document.querySelector('select[name=status]');
  const t0 = performance.now();
  select.value = select.options[1].value;
  select.dispatchEvent(new Event('change'));
  document.getElementById('list').getBoundingClientRect();
  return performance.now() - t0;
}"""


def measure(browser, path: Path, repeats: int, positions: list[int]) -> dict:
    figures: dict[str, list[float]] = {k: [] for k in ("ready", "dom", "load", "open", "hover", "filter")}
    drawn = 0
    for repeat in range(repeats):
        tab = browser.new_tab(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        tab.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        tab.goto(path.as_uri(), wait_until="load", timeout=120_000)
        ready, dom, load = tab.evaluate(
            "() => { const n = performance.getEntriesByType('navigation')[0];"
            " return [performance.getEntriesByName('viewer-ready')[0].startTime, n.domContentLoadedEventEnd,"
            " n.loadEventEnd]; }"
        )
        figures["ready"].append(ready)
        figures["dom"].append(dom)
        figures["load"].append(load)
        figures["filter"].append(tab.evaluate(MEASURE_FILTER))
        tab.evaluate("() => { location.hash = '#run=0'; }")
        elapsed, drawn = tab.evaluate(MEASURE_OPEN, positions[repeat % len(positions)])
        figures["open"].append(elapsed)
        figures["hover"].append(tab.evaluate(MEASURE_HOVER))
        if errors:
            raise RuntimeError(f"the page raised: {errors}")
        tab.close()
    result = {key: statistics.median(values) for key, values in figures.items()}
    result["tokens_drawn"] = drawn
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=8192, help="response tokens per sample")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write-results", action="store_true", help="rewrite this section of bench/RESULTS.md")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from slime_search_r1.viewer import build_page
    from support.browser import chromium_path, launch_or_skip
    from support.qwen_tokenizer import qwen25_tokenizer_dir

    if chromium_path() is None:
        print("needs chromium: apt-get install -y chromium", file=sys.stderr)
        return 2
    tokenizer_dir = str(qwen25_tokenizer_dir())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    started = time.perf_counter()
    samples = make_samples(tokenizer, args.samples, args.tokens)
    print(
        f"{args.samples} samples x {args.tokens} tokens made in {time.perf_counter() - started:.1f} s", file=sys.stderr
    )

    browser = launch_or_skip()
    rows = []
    try:
        for with_train in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                write_dumps(folder / "dumps", samples, with_train)
                dump_mb = sum(p.stat().st_size for p in (folder / "dumps").rglob("*.pt")) / 1e6
                started = time.perf_counter()
                built = build_page([folder / "dumps"], folder / "page", tokenizer_path=Path(tokenizer_dir))
                build_s = time.perf_counter() - started
                figures = measure(browser, built.path, args.repeats, [0, args.samples // 2, args.samples - 1])
                rows.append((with_train, dump_mb, built.size / 1e6, build_s, figures))
    finally:
        browser.close()

    header = (
        "| dumps | dump files | page | build | ready | DOM loaded | load | open a sample (tokens) | hover | filter |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [header]
    for with_train, dump_mb, page_mb, build_s, f in rows:
        lines.append(
            f"| rollout{' + train' if with_train else ''} | {dump_mb:.0f} MB | {page_mb:.0f} MB | {build_s:.1f} s "
            f"| {f['ready'] / 1000:.2f} s | {f['dom'] / 1000:.2f} s | {f['load'] / 1000:.2f} s "
            f"| {f['open']:.0f} ms ({f['tokens_drawn']}) | {f['hover']:.1f} ms | {f['filter']:.0f} ms |"
        )
    worst = max(f["load"] for *_, f in rows) / 1000
    met = "met" if worst < TARGET_OPEN_S else "NOT met"
    verdict = f"Target: the page opened (load event) in < {TARGET_OPEN_S:.0f} s: {met} ({worst:.2f} s at most)."
    table = "\n".join(lines)
    print(table)
    print(verdict)
    if args.write_results:
        import os
        import platform

        from results_md import write_section

        body = (
            f"`bench/viewer_page.py --samples {args.samples} --tokens {args.tokens} --repeats {args.repeats}`: a "
            f"{args.samples}-sample rollout, {args.tokens} response tokens each (XML turns of ~400 model and ~500 "
            "retrieved tokens, real Qwen2.5 ids), written by slime's dump writers; the page built by the viewer and "
            f"opened from disk in headless chromium; medians of {args.repeats} loads. Machine: {os.cpu_count()} "
            f"CPUs, {platform.machine()}.\n\n{table}\n\n{verdict}"
        )
        write_section("Viewer page", body)
    return 0 if worst < TARGET_OPEN_S else 1


if __name__ == "__main__":
    sys.exit(main())
