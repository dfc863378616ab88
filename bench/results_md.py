"""bench/RESULTS.md is shared by several benchmarks: each rewrites only its own `## <title>` section."""

import re
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# Benchmark results\n\nEach section is written by the benchmark named in it; rerun that command to refresh it.\n"
)


def write_section(title: str, body: str, path: Path = RESULTS) -> None:
    text = path.read_text() if path.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


def write_block(title: str, key: str, text: str, path: Path = RESULTS) -> None:
    """Replace the block marked `key` inside section `## <title>`, or add it at the section's end: a section that
    several runs share (one block per --sizes of the load benchmark). Everything else, including hand-written
    notes in the section outside the markers, is kept."""
    existing = path.read_text() if path.exists() else HEADER
    heading = f"## {title}"
    if heading not in existing:
        existing = existing.rstrip("\n") + f"\n\n{heading}\n"
    begin, end = f"<!-- {key} -->", f"<!-- end {key} -->"
    block = f"{begin}\n{text}{end}\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n", re.S)
    if pattern.search(existing):
        existing = pattern.sub(lambda _: block, existing)
    else:
        section_start = existing.index(heading)
        next_section = existing.find("\n## ", section_start + len(heading))
        cut = len(existing) if next_section < 0 else next_section + 1
        existing = existing[:cut].rstrip("\n") + "\n\n" + block + ("\n" + existing[cut:] if next_section >= 0 else "")
    path.write_text(existing)


def report(title: str, text: str, write: bool = True) -> None:
    """Print a benchmark's section and, unless told not to, write it into bench/RESULTS.md."""
    print("\n" + text)
    if write:
        write_section(title, text)
        print(f"wrote {RESULTS.name} (section {title!r})")
