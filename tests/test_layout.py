"""The folder's layout: slime loads the hooks from the folder alone, and the import graph stays a tree."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.slime_compat import SITE, slime_root, slime_src_env, using_real_slime


REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "slime_search_r1"
TOP_LEVEL = {path.stem for path in REPO.glob("*.py")}  # generate_with_search, qa_em_format, evaluate, ...
HOOKS = [
    "generate_with_search.generate",  # --custom-generate-function-path
    "generate_with_search.reward_func",  # --custom-rm-path
    "generate_with_search.post_process_rewards",  # --custom-reward-post-process-path
    "generate_with_search.log_rollout_metrics",  # --custom-rollout-log-function-path
    "generate_with_search.log_eval_rollout_metrics",  # --custom-eval-rollout-log-function-path
]


def test_slime_loads_the_hooks_from_a_copy_of_the_folder_alone(tmp_path):
    """As the launch script sets it: only the example folder (and slime) on the path, tests/ not shipped."""
    copy = tmp_path / "search-r1"
    shutil.copytree(
        REPO,
        copy,
        ignore=shutil.ignore_patterns(
            "tests", ".git", ".venv", ".cache", "*.egg-info", "__pycache__", "bench", "logs"
        ),
    )
    paths = [str(copy), str(slime_root())] + ([str(SITE)] if using_real_slime() else [])
    code = (
        "import inspect, sys\n"
        "from slime.utils.misc import load_function\n"
        f"for path in {HOOKS!r}:\n"
        "    function = load_function(path)\n"
        "    print(path, inspect.getsourcefile(function))\n"
        "for module in list(sys.modules.values()):\n"
        "    print('file', getattr(module, '__file__', None))\n"
    )
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=empty,  # not the repository: nothing of it may leak in through the working directory
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(paths), "HOME": str(tmp_path), **slime_src_env()},
        capture_output=True,
        text=True,
        timeout=280,  # only against a hang (under pytest's 300 s): a busy machine loads slowly
    )
    assert result.returncode == 0, result.stderr
    for hook in HOOKS:
        assert f"{hook} {copy}" in result.stdout, result.stdout  # loaded from the copy, not the repository
    files = [line.removeprefix("file ") for line in result.stdout.splitlines() if line.startswith("file /")]
    # slime, the interpreter's packages, and (real slime) the start-up hook that stands in for ray & co.
    interpreter = (f"{Path(sys.prefix)}/", f"{Path(sys.prefix).resolve()}/")  # a linked .venv shows either path
    outside = (f"{slime_root()}/", *interpreter, f"{SITE}/", str(SITE.parent / "slime_compat.py"))
    from_repository = [f for f in files if f.startswith(f"{REPO}/") and not f.startswith(outside)]
    assert from_repository == []  # nothing but the copy (and slime) was imported


PROJECT_FILES = [
    path
    for path in REPO.rglob("*.py")
    if not {".venv", ".git", ".cache", "slime_stub"} & set(path.relative_to(REPO).parts)
]
MODULE_FOLDERS = sorted({path.parent for path in PROJECT_FILES})


def test_no_module_is_named_like_a_standard_library_module():
    """Whichever folder comes first on sys.path (a script run as a file puts its own there) must not hide the
    standard library: slime_search_r1/http.py once broke `import urllib.request` for `python slime_search_r1/x.py`."""
    assert [str(p.relative_to(REPO)) for p in PROJECT_FILES if p.stem in sys.stdlib_module_names] == []


@pytest.mark.parametrize("folder", MODULE_FOLDERS, ids=lambda folder: str(folder.relative_to(REPO)) or ".")
def test_a_script_run_from_any_folder_still_imports_the_standard_library_and_aiohttp(folder):
    code = "import sys; sys.path.insert(0, sys.argv[1]); import urllib.request, xml.etree.ElementTree, json, aiohttp"
    result = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_launch_script_runs_the_plugin_check_as_a_module():
    script = (REPO / "run_qwen2.5_3B.sh").read_text()
    assert "-m slime_search_r1.launch " in script
    assert "slime_search_r1/" not in re.sub(r"#.*", "", script)  # no plugin file is run as a script


def imports_of(path: Path) -> set[str]:
    """The project modules `path` imports (dotted names), whatever the import's form."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in TOP_LEVEL | {"slime_search_r1", "local_dense_retriever"}}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


RETRIEVER = REPO / "local_dense_retriever"
MODULES = {module_name(path): path for path in [*REPO.glob("*.py"), *PACKAGE.rglob("*.py"), *RETRIEVER.rglob("*.py")]}


def project_edges() -> dict[str, set[str]]:
    return {name: {i for i in imports_of(path) if i in MODULES and i != name} for name, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(name for name in MODULES if name.startswith("slime_search_r1")))
def test_the_package_imports_nothing_from_the_top_level(module):
    """The top level (the entry points and the seed's files) uses the package, never the other way round."""
    assert {i for i in imports_of(MODULES[module]) if i.split(".")[0] in TOP_LEVEL} == set()


def test_the_import_graph_has_no_cycle():
    edges = project_edges()
    visiting, done = [], set()

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in visiting, "import cycle: " + " -> ".join([*visiting[visiting.index(name) :], name])
        visiting.append(name)
        for target in sorted(edges[name]):
            visit(target)
        visiting.pop()
        done.add(name)

    for name in sorted(edges):
        visit(name)


# The retriever's layers, lowest first: a layer imports only from itself and the layers before it, and nothing
# imports the thin command-line scripts at the top of local_dense_retriever/.
RETRIEVER_LAYERS = ["retrieval", "serving", "building", "demo"]
RETRIEVER_SCRIPTS = {"retrieval_server", "index_builder", "download"}


def retriever_layer(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] != "local_dense_retriever" or len(parts) < 2 or parts[1] not in RETRIEVER_LAYERS:
        return None
    return RETRIEVER_LAYERS.index(parts[1])


@pytest.mark.parametrize("module", sorted(name for name in MODULES if retriever_layer(name) is not None))
def test_a_retriever_layer_imports_nothing_from_a_layer_above_it(module):
    layer = retriever_layer(module)
    above = {i for i in imports_of(MODULES[module]) if (retriever_layer(i) or 0) > layer}
    assert above == set()


def test_nothing_imports_the_retrievers_command_line_scripts():
    importers = {
        name
        for name, targets in project_edges().items()
        for target in targets
        if target.removeprefix("local_dense_retriever.") in RETRIEVER_SCRIPTS
    }
    assert importers == set()


def test_the_evaluation_imports_nothing_from_the_viewer():
    """The viewer reads what an evaluation writes (evaluation/store.py's files), so it sits above the evaluation:
    evaluate.py, at the top, hands a run's folder to the viewer, and no evaluation module imports it, even lazily."""
    importers = {
        f"{name} -> {target}"
        for name, targets in project_edges().items()
        for target in targets
        if name.startswith("slime_search_r1.evaluation") and target.startswith("slime_search_r1.viewer")
    }
    assert importers == set()


def test_the_top_level_holds_what_a_slime_user_looks_for():
    assert TOP_LEVEL == {
        "generate_with_search",
        "qa_em_format",
        "google_search_server",
        "oai_format_data_preprocess",
        "evaluate",
    }


def test_no_test_skips_when_a_project_module_fails_to_import():
    """pytest.importorskip is for optional third-party packages: on the project's own module it would turn an
    import error in the code under test into a skip, and the suite would pass without running that test."""
    project = TOP_LEVEL | {"slime_search_r1", "local_dense_retriever"}
    skipped = []
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "importorskip"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).split(".")[0] in project
            ):
                skipped.append(f"{path.relative_to(REPO)}:{node.lineno} {node.args[0].value}")
    assert skipped == []


# ---- the documentation's links ----------------------------------------------------------------------------------

MARKDOWN_PAGES = sorted(
    path
    for path in REPO.rglob("*.md")
    if not {".venv", ".git", ".cache", "slime_stub", "node_modules"} & set(path.relative_to(REPO).parts)
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), images included
HEADING = re.compile(r"^#{1,6} +(.+?)\s*$", re.MULTILINE)


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: the text lower-cased, every character but letters, digits, `_`,
    `-` and spaces dropped, spaces as hyphens; a repeated anchor gets -1, -2, ..."""
    anchors, seen = set(), {}
    for heading in HEADING.findall(without_code_blocks(page.read_text(encoding="utf-8"))):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
        anchor = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        anchors.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


@pytest.mark.parametrize("page", MARKDOWN_PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"`[^`\n]*`", "", without_code_blocks(page.read_text(encoding="utf-8")))  # code is not a link
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_every_documentation_page_has_its_chinese_twin():
    english = [path for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")] if not path.stem.endswith("_zh")]
    missing = [path for path in english if not path.with_name(f"{path.stem}_zh.md").is_file()]
    assert [str(path.relative_to(REPO)) for path in missing] == []
