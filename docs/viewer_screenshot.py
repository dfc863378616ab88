"""The viewer's pictures in docs/watching.md: a real page made from the test dumps, photographed in headless chromium.

The dumps are the tests' (tests/support/viewer_dumps.py: real episodes of the test engine, written by slime's dump
writers); the page is the viewer's; the sample view shows the first XML sample with one trained token selected,
the one whose train and rollout log probs differ. PNGs are cut to 64 colours to stay small.

    .venv/bin/python docs/viewer_screenshot.py      # writes docs/viewer_list.png and docs/viewer_sample.png
"""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "slime_stub"), str(ROOT / "tests")]


def small_png(raw: bytes, path: Path) -> None:
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(raw)).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    image.save(path, optimize=True)


def main() -> int:
    from transformers import AutoTokenizer

    from slime_search_r1.viewer import build_page
    from support.browser import launch_or_skip
    from support.qwen_tokenizer import qwen25_tokenizer_dir
    from support.viewer_dumps import make_dumps

    tokenizer_dir = str(qwen25_tokenizer_dir())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with tempfile.TemporaryDirectory() as tmp:
        dumps = make_dumps(Path(tmp) / "dump_details", tokenizer, tokenizer_dir)
        page = build_page([dumps.folder], Path(tmp) / "viewer", title="Search-R1 trajectories: rollout 3").path
        browser = launch_or_skip()
        try:
            tab = browser.new_tab(viewport={"width": 1280, "height": 1080})
            tab.goto(page.as_uri())
            tab.wait_for_selector("html[data-ready='1']", state="attached")
            small_png(tab.screenshot(), Path(__file__).with_name("viewer_list.png"))
            position = dumps.names.index("right")
            tab.evaluate(f"location.hash = '#run=0&sample={position}'")
            tab.wait_for_selector(f"html[data-sample-ready='0-{position}']", state="attached")
            tab.click("#sample-view span.t.gap")
            small_png(tab.screenshot(), Path(__file__).with_name("viewer_sample.png"))
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
