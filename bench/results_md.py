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


def report(title: str, text: str, write: bool = True) -> None:
    """Print a benchmark's section and, unless told not to, write it into bench/RESULTS.md."""
    print("\n" + text)
    if write:
        write_section(title, text)
        print(f"wrote {RESULTS.name} (section {title!r})")
