"""`python -m local_dense_retriever.demo` (what `make demo` runs) stops with the retrieval server it started on
Ctrl-C, SIGTERM and SIGHUP, while the server loads and while it serves (--serve): every process it had started is gone
afterwards, found by PID.

The demo runs for real on the tests' small wiki (its cached index, copied: the demo reuses a moved cache as it is);
only the summaries it loads are that small wiki's instead of all 10,033."""

import json
import shutil
import signal
import subprocess
import sys

import pytest

from support import process_tree
from support.interrupt import interruptible
from support.retriever_fixtures import small_wiki_fixture  # noqa: F401

SMALL_DEMO = (
    "import json, sys\n"
    "from local_dense_retriever.demo import embedded_default, mini_wiki\n"
    "titles = json.load(open(sys.argv[1]))\n"
    "by_title = {summary['title']: summary for summary in mini_wiki.load_summaries()}\n"
    "mini_wiki.load_summaries = lambda: [by_title[title] for title in titles]\n"
    "sys.exit(embedded_default.main(sys.argv[2:]))\n"
)


def start_small_demo(wiki, tmp_path, *flags: str) -> subprocess.Popen:
    cache = tmp_path / "mini_wiki"
    shutil.copytree(wiki.corpus_path.parent, cache)
    titles = tmp_path / "titles.json"
    titles.write_text(json.dumps(wiki.titles))
    command = [sys.executable, "-c", SMALL_DEMO, str(titles), "--cache_dir", str(cache), *flags]
    return subprocess.Popen(interruptible(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_until(process: subprocess.Popen, prefix: str) -> str:
    """Its stdout up to the line that starts with `prefix` (read as it comes: an event, not a time window)."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return "".join(lines)
    raise AssertionError(f"it exited before printing {prefix!r}:\n{''.join(lines)}{process.stderr.read()}")


def assert_a_signal_stops_everything(process: subprocess.Popen, signum: int) -> None:
    """Sends `signum` to the process alone (not its group) and waits for it to exit: nothing it had started runs on,
    and it says why it stopped, with the shell's exit code for the signal."""
    started = process_tree.tree(process.pid)
    assert any("local_dense_retriever.retrieval_server" in p.command for p in started)
    try:
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)  # only against a hang
        assert process_tree.survivors(started) == []
        assert process.returncode == 128 + signum, err
        assert f"stopped by {signal.Signals(signum).name}" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        process_tree.kill(started)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_the_server_loads_stops_both(small_wiki, tmp_path, signum):
    demo = start_small_demo(small_wiki, tmp_path)
    assert "using the cached corpus and index" in read_until(demo, "starting the retrieval server")  # copy reused
    assert_a_signal_stops_everything(demo, signum)


def test_sigterm_while_serving_stops_the_server(small_wiki, tmp_path):
    """`make demo` passes SIGTERM on to the demo (GNU make does); a terminal's Ctrl-C or hang-up reach both."""
    demo = start_small_demo(small_wiki, tmp_path, "--serve")
    read_until(demo, "serving at")
    assert_a_signal_stops_everything(demo, signal.SIGTERM)
