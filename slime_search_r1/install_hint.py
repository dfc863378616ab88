"""One line naming the install step, instead of a traceback, when a root script runs in a Python without the
project's packages (a bare python3): `with needs_extra("evaluate.py", "data"): import ...`. It imports nothing but
the standard library, so it works in exactly that Python."""

import contextlib
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout, whose pyproject.toml declares the extras
OURS = ("slime_search_r1", "generate_with_search", "slime")  # not packages an extra installs (slime: its own line)


@contextlib.contextmanager
def needs_extra(script: str, extra: str) -> Iterator[None]:
    """A missing third-party package inside the block exits with code 2 (a bad environment, as evaluate.py's other
    refusals) and one line on stderr naming the package, this Python and the pip command that installs it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        package = (exc.name or "").split(".")[0]
        if not package or package in OURS:
            raise
        print(
            f"{script}: error: the {package} package is not installed for {sys.executable} ({exc}); install what "
            f"{script} needs with: {shlex.quote(sys.executable)} -m pip install -e '{ROOT}[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
