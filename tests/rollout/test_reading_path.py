"""The rollout reads in a few files: one XML episode with a search turn and an answer turn runs code in at most eleven
modules of the package (loop.py and the modules it calls), so that a newcomer reads loop.py and what it calls in one
sitting; the settings are checked once per configuration and slime's flags once per args, not per episode. Each
built-in is declared once, where the registry finds it; naming or checking a setting imports none of them, and what
the viewer and the reward read imports no slime."""

import subprocess
import sys
from pathlib import Path

import pytest

from generate_with_search import generate
from slime.utils.types import Sample
from slime_search_r1.registry import ANSWER_SCORES, PROTOCOLS, SEARCH_BACKENDS, TOKEN_DRIVERS, TOOLS
from support.episodes import ANSWER_TURN, QUESTION, SEARCH_TURN, searches, xml_sample
from support.slime_rollout import slime_sampling_params

ROOT = Path(__file__).resolve().parents[2]
MOST_MODULES = 11
# once per configuration and args: the settings, resolved and checked, and slime's flags
CHECKS = {f"slime_search_r1.settings.{module}" for module in ("kinds", "table", "sources", "view", "rules")}
CHECKS |= {"slime_search_r1.slime_flags"}


async def modules_run_by(episode) -> set[str]:
    """The package's modules whose code ran while `episode` (a coroutine) ran."""
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
        sample = await episode
    finally:
        sys.setprofile(previous)
    assert sample.status == Sample.Status.COMPLETED and searches(sample) == 1  # the episode ran both turns
    return ran


async def test_one_search_episode_runs_code_in_at_most_eleven_package_modules(
    make_args, tokenizer, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args = make_args()
    first = await modules_run_by(generate(args, xml_sample(tokenizer), slime_sampling_params(1024)))
    then = await modules_run_by(generate(args, xml_sample(tokenizer), slime_sampling_params(1024)))
    assert len(then) <= MOST_MODULES, f"{len(then)} modules: " + ", ".join(sorted(then))
    assert first - then == CHECKS  # the first episode of a configuration checks it, and slime's flags, once
    assert not CHECKS & then


@pytest.mark.parametrize("registry", [PROTOCOLS, TOKEN_DRIVERS, TOOLS, SEARCH_BACKENDS, ANSWER_SCORES])
def test_every_built_in_is_declared_once_where_it_lives(registry):
    """registry.py says where each built-in lives; the loop, the data script, the scorer and evaluate.py all get
    their entries from it, so each is found there."""
    for name in registry.builtins:
        entry = registry.get(name)
        assert entry is not None
        if registry is TOOLS:
            assert entry.name == name
    assert [name for name in registry.names()] == list(registry.builtins)


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
        "import slime_search_r1.launch.__main__\n"
        "from slime_search_r1.settings.sources import resolve_config, search_r1_configs\n"
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
