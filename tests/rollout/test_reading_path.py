"""The rollout reads in a few files: one XML episode with a search turn and an answer turn runs code in at most ten
modules of the package (the settings and slime flag checks, loop.py and the modules it calls), so that a newcomer
reads loop.py and what it calls in one sitting. The built-ins are imported where they are used, by name; naming or
checking a setting imports none of them, and what the viewer and the reward read imports no slime."""

import subprocess
import sys
from pathlib import Path

import oai_format_data_preprocess
from generate_with_search import generate
from slime.utils.types import Sample
from slime_search_r1 import loop
from slime_search_r1.registry import PROTOCOLS, SEARCH_BACKENDS, TOKEN_DRIVERS, TOOLS
from slime_search_r1.tools.search import BUILT_IN_SEARCH_BACKENDS
from support.episodes import ANSWER_TURN, QUESTION, SEARCH_TURN, searches, xml_sample
from support.slime_rollout import slime_sampling_params

ROOT = Path(__file__).resolve().parents[2]
MOST_MODULES = 13


async def test_one_search_episode_runs_code_in_at_most_ten_package_modules(
    make_args, tokenizer, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args, sample, sampling_params = make_args(), xml_sample(tokenizer), slime_sampling_params(1024)
    ran: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":  # a Python function (or a coroutine resumed) starts running in this thread
            # the module whose globals the code runs in: a dataclass's generated __init__ counts for its module
            module = frame.f_globals.get("__name__", "")
            if module.split(".")[0] == "slime_search_r1":
                ran.add(module)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        sample = await generate(args, sample, sampling_params)
    finally:
        sys.setprofile(previous)
    assert sample.status == Sample.Status.COMPLETED and searches(sample) == 1  # the episode ran both turns
    assert len(ran) <= MOST_MODULES, f"{len(ran)} modules: " + ", ".join(sorted(ran))


def test_every_built_in_a_registry_names_is_imported_under_that_name():
    """registry.py names the built-ins; the code that picks one holds its object under the same name."""
    assert tuple(loop.BUILT_IN_PROTOCOLS) == PROTOCOLS.builtins
    assert tuple(loop.BUILT_IN_TOKEN_DRIVERS) == TOKEN_DRIVERS.builtins
    assert tuple(loop.BUILT_IN_TOOLS) == TOOLS.builtins
    assert [tool.name for tool in loop.BUILT_IN_TOOLS.values()] == list(TOOLS.builtins)
    assert tuple(oai_format_data_preprocess.BUILT_IN_TOOLS) == TOOLS.builtins  # the tools a chat-format row offers
    assert tuple(BUILT_IN_SEARCH_BACKENDS) == SEARCH_BACKENDS.builtins


def imported_by(code: str) -> list[str]:
    """The modules a fresh interpreter holds after `code`, run with the project alone on its path and slime made
    unimportable (the code fails if it needs slime)."""
    program = f"import sys\nsys.modules['slime'] = None\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", program],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_naming_and_checking_a_setting_imports_no_implementation():
    modules = imported_by(
        "import slime_search_r1.launch_check\n"
        "from slime_search_r1.settings import resolve_config, search_r1_configs\n"
        "resolve_config(search_r1_configs({'llm_api_mode': 'chat', 'tools': ['search', 'access']}, {}))"
    )
    implementations = ("loop", "episode", "tokens", "tools", "protocols", "search")
    loaded = [m for m in modules if m.split(".")[:2] in [["slime_search_r1", part] for part in implementations]]
    assert loaded == []


def test_the_turns_the_record_the_protocols_and_the_tools_import_no_slime():
    """The viewer and the reward read them (and the records they define) on a machine without slime."""
    modules = imported_by(
        "import slime_search_r1.episode, slime_search_r1.protocols.chat, slime_search_r1.protocols.chat_reward\n"
        "import slime_search_r1.tools.access, slime_search_r1.tools.search"
    )
    assert {"slime_search_r1.episode", "slime_search_r1.tools.search"} <= set(modules)
    assert [m for m in modules if m.split(".")[0] == "slime"] == ["slime"]  # the blocked entry, nothing under it
