"""The seams are open by name: a search backend, a token-tracking mode and a setting are each added from a file of
their own (here, this test file, or an extension module the launch check imports), and no file under
slime_search_r1/ changes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from generate_with_search import generate, reward_func
from slime.utils.types import Sample
from slime_search_r1.registry import SEARCH_BACKENDS, TOKEN_DRIVERS
from slime_search_r1.settings.kinds import ConfigError, Integer
from slime_search_r1.settings.sources import resolve_config
from slime_search_r1.settings.table import SETTINGS, Setting, register_setting
from slime_search_r1.tokens.manual import ManualDriver
from support.episodes import ANSWER, MODES, MODE_IDS, QUESTION, SEARCH, run_chat, run_episode, sample_for, searches
from support.fidelity import assert_faithful
from support.slime_compat import subprocess_pythonpath

ROOT = Path(__file__).resolve().parents[2]

# ---- a third search backend ---------------------------------------------------------------------------------------

ATLAS = {"capital of France": [{"contents": '"Atlas of France"\nParis is the capital.', "url": "atlas://france"}]}


async def atlas_search(config, query: str, give_up) -> list[dict]:
    """A search backend of one's own: documents in the retrieval API's shape."""
    return ATLAS.get(query, [])


@pytest.fixture
def atlas(search_config):
    SEARCH_BACKENDS.register("atlas", atlas_search)
    search_config["search_backend"] = "atlas"
    yield
    SEARCH_BACKENDS.unregister("atlas")


def test_an_unregistered_backend_is_refused_with_the_registered_ones(search_config):
    search_config["search_backend"] = "atlas"
    with pytest.raises(ConfigError, match=r"\['search_backend'\]='atlas' is invalid; accepted: local \| google$"):
        resolve_config(search_config)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_a_registered_backend_answers_the_searches(
    atlas, mode, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    assert searches(episode.sample) == 1
    assert 'Doc 1(Title: "Atlas of France") Paris is the capital.' in episode.sample.response
    assert await reward_func(episode.args, episode.sample) == 1.0


# ---- a new token-tracking mode ------------------------------------------------------------------------------------


class TurnCountingDriver(ManualDriver):
    """A token-tracking mode of one's own: the manual driver, counting the turns it generated."""

    turns = 0

    async def generate(self, sampling_params: dict):
        type(self).turns += 1
        return await super().generate(sampling_params)


@pytest.fixture
def counting_mode():
    TOKEN_DRIVERS.register("counting", TurnCountingDriver)
    TurnCountingDriver.turns = 0
    yield
    TOKEN_DRIVERS.unregister("counting")


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_a_registered_token_tracking_mode_drives_the_episode(
    counting_mode, mode, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    sample, prompt_ids = sample_for(mode, tokenizer)
    sample = await run_chat(make_args(), search_config, mode, tracking="counting", sample=sample)
    assert TurnCountingDriver.turns == 2
    assert sample.status == Sample.Status.COMPLETED
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)


# ---- a new setting ------------------------------------------------------------------------------------------------


@pytest.fixture
def rerank_setting():
    register_setting(Setting("atlas.rerank_depth", 10, Integer(1, 50), "ATLAS_RERANK_DEPTH", "hits to rerank"))
    yield
    del SETTINGS["atlas.rerank_depth"]


def test_a_registered_setting_is_read_from_the_dict_and_the_environment(rerank_setting):
    from slime_search_r1.settings.sources import search_r1_configs

    assert resolve_config(search_r1_configs({}, {})).atlas.rerank_depth == 10
    assert resolve_config(search_r1_configs({"atlas": {"rerank_depth": 20}}, {})).atlas.rerank_depth == 20
    assert resolve_config(search_r1_configs({}, {"ATLAS_RERANK_DEPTH": "30"})).atlas.rerank_depth == 30


def test_a_registered_setting_is_checked_and_its_errors_name_their_source(rerank_setting):
    from slime_search_r1.settings.sources import search_r1_configs

    with pytest.raises(ConfigError, match=r"^environment variable ATLAS_RERANK_DEPTH='99' is out of range"):
        resolve_config(search_r1_configs({}, {"ATLAS_RERANK_DEPTH": "99"}))
    with pytest.raises(ConfigError, match=r"^SEARCH_R1_CONFIGS\['atlas'\]\['rerank_depth'\]=0 is out of range"):
        resolve_config(search_r1_configs({"atlas": {"rerank_depth": 0}}, {}))


def test_a_setting_is_declared_once():
    with pytest.raises(ValueError, match="'max_turns' is declared already"):
        register_setting(Setting("max_turns", 3, Integer(1, 64)))
    with pytest.raises(ValueError, match="SEARCH_R1_TOPK already overrides another setting"):
        register_setting(Setting("atlas.topk", 3, Integer(1, 64), "SEARCH_R1_TOPK"))


# ---- an extension module, as the launch and generate() meet it --------------------------------------------------

EXTENSION = """
from slime_search_r1.registry import SEARCH_BACKENDS
from slime_search_r1.settings.kinds import Integer
from slime_search_r1.settings.table import Setting, register_setting


async def search(config, query, give_up):
    return [{"contents": '"Atlas"\\nAn atlas.'}] * config.atlas.rerank_depth


SEARCH_BACKENDS.register("atlas", search)
register_setting(Setting("atlas.rerank_depth", 3, Integer(1, 50), "ATLAS_RERANK_DEPTH"))
"""


def launch_dry_run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """A dry run of the launch (its checks, before Ray starts) with the extension on the path."""
    (tmp_path / "atlas_extension.py").write_text(EXTENSION)
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SEARCH", "ATLAS"))},
        "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_pythonpath()]),
        **env,
    }
    command = [sys.executable, "-m", "slime_search_r1.launch", str(ROOT / "generate_with_search.py"), "--dry-run"]
    # --rollout-batch-size: the one flag slime's own parser requires (the launch checks with it when slime is there)
    command += ["--", "--rollout-batch-size", "8"]
    return subprocess.run(command, env=environment, capture_output=True, text=True, cwd=tmp_path, timeout=60)


def test_the_launch_sees_what_an_extension_registers(tmp_path):
    result = launch_dry_run(tmp_path, SEARCH_R1_EXTENSIONS="atlas_extension", SEARCH_BACKEND="atlas")
    assert result.returncode == 0, result.stderr
    result = launch_dry_run(tmp_path, SEARCH_R1_EXTENSIONS="atlas_extension", ATLAS_RERANK_DEPTH="0")
    assert result.returncode == 1
    assert "environment variable ATLAS_RERANK_DEPTH='0' is out of range; accepted: 1 to 50" in result.stderr


def test_without_the_extension_its_backend_is_refused_at_launch(tmp_path):
    result = launch_dry_run(tmp_path, SEARCH_BACKEND="atlas")
    assert result.returncode == 1
    assert "environment variable SEARCH_BACKEND='atlas' is invalid; accepted: local | google" in result.stderr


def test_an_extension_that_cannot_be_imported_stops_the_launch(tmp_path):
    result = launch_dry_run(tmp_path, SEARCH_R1_EXTENSIONS="atlas_extension,no_such_module")
    assert result.returncode == 1
    assert "environment variable SEARCH_R1_EXTENSIONS: cannot import the extension module 'no_such_module'" in (
        result.stderr
    )


def test_the_settings_list_shows_an_extensions_setting(tmp_path):
    (tmp_path / "atlas_extension.py").write_text(EXTENSION)
    result = subprocess.run(
        [sys.executable, "-m", "slime_search_r1.launch", "--list"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_pythonpath()]),
             "SEARCH_R1_EXTENSIONS": "atlas_extension"},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "atlas.rerank_depth\tATLAS_RERANK_DEPTH\t3\tinteger, 1 to 50\tplugin\t" in result.stdout
    assert "max_turns\tSEARCH_R1_MAX_TURNS\t3\tinteger, 1 to 128\tplugin\t" in result.stdout


async def test_generate_imports_the_extensions_its_settings_name(make_args, engine, search_config):
    search_config["extensions"] = ["no_such_module_here"]
    with pytest.raises(ConfigError, match=r"^SEARCH_R1_CONFIGS\['extensions'\]: cannot import the extension module"):
        await generate(make_args(), Sample(prompt="x"), {})
