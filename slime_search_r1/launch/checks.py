"""Before any GPU is spent: the checks generate() would make at its first sample, made on the launch command.

SEARCH_R1_CONFIGS is read from generate_with_search.py's source, not imported (that imports slime), so it must stay
a literal dict; the environment overrides it as it would in the job.
"""

import ast
from pathlib import Path
from typing import Any

from slime_search_r1.families.detection import check_checkpoint_family
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.view import SearchR1Config
from slime_search_r1.slime_flags import check_router_mode, check_slime_args, parse_slime_flags

PLUGIN = Path(__file__).resolve().parents[2] / "generate_with_search.py"


def configs_from_source(path: Path) -> dict[str, Any]:
    """The dict generate_with_search.py passes to search_r1_configs(), read without importing the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SEARCH_R1_CONFIGS" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "search_r1_configs":
                value = value.args[0] if value.args else value
            try:
                configs = ast.literal_eval(value)
            except ValueError:
                configs = None
            if not isinstance(configs, dict):
                raise ConfigError(
                    f"SEARCH_R1_CONFIGS in {path} is not search_r1_configs({{...}}) of a literal dict, so it cannot "
                    "be checked before launch; keep it a literal (set values through environment variables) or "
                    "skip the check with SKIP_PLUGIN_CHECK=1"
                )
            return configs
    raise ConfigError(f"{path} defines no SEARCH_R1_CONFIGS")


def check_plugin(config: SearchR1Config, train_args: list[str], legacy_router: bool) -> list[str]:
    """What generate() would refuse at its first sample, checked on train.py's flags; returns warnings."""
    check_router_mode(config, legacy_router)
    flags = parse_slime_flags(train_args)
    mode, tracking = config.llm_api_mode, config.token_tracking_mode
    check_checkpoint_family(config.model_family, mode, tracking, flags.hf_checkpoint)
    return check_slime_args(flags, config, at_launch=True)
