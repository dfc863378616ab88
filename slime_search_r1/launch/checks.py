"""Before any GPU is spent: the checks generate() would make at its first sample, made on the launch command.

    python -m slime_search_r1.launch_check [--plugin generate_with_search.py] -- <train.py's flags>
    python -m slime_search_r1.launch_check --list        # every setting: key, variable, default, what it accepts

run_qwen2.5_3B.sh makes them through python -m slime_search_r1.launch (command.py), with the flags it adds.
SEARCH_R1_CONFIGS is read from generate_with_search.py's source, not imported (that imports slime), so it must stay
a literal dict; the environment overrides it as it would in the job. Run it as a module: run as a file, its folder
would come first on sys.path.
"""

import argparse
import ast
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slime_search_r1.launch.knobs import TRAINING
from slime_search_r1.settings import (
    SETTINGS,
    ConfigError,
    SearchR1Config,
    read_environment,
    resolve_config,
    search_r1_configs,
)
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
    return check_slime_args(parse_slime_flags(train_args), config, at_launch=True)


def check_launch(plugin: Path, train_args: list[str], environ: Mapping[str, str]) -> list[str]:
    """Everything generate() would refuse at its first sample, checked from the launch command; returns warnings."""
    config = resolve_config(search_r1_configs(configs_from_source(plugin), environ))
    legacy_router = read_environment([TRAINING["legacy_slime_router"]], environ)[0].legacy_slime_router
    return check_plugin(config, train_args, legacy_router)


def settings_table() -> str:
    rows = ["key\tvariable\tdefault\taccepted\twhat it sets"]
    for setting in SETTINGS.values():
        default = "derived" if callable(setting.default) else repr(setting.default)
        kind = type(setting.kind).__name__.lower()
        rows.append(f"{setting.key}\t{setting.env or '-'}\t{default}\t{kind}\t{setting.doc}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slime_search_r1.launch_check",
        description="Check SEARCH_R1_CONFIGS (with its environment variables) and slime's flags before launching.",
    )
    parser.add_argument("--plugin", type=Path, default=PLUGIN, help="the file that defines SEARCH_R1_CONFIGS")
    parser.add_argument("--list", action="store_true", help="print every setting and exit")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then train.py's flags")
    options = parser.parse_args(argv)
    train_args = options.train_args[1:] if options.train_args[:1] == ["--"] else options.train_args
    try:
        if options.list:
            # the extensions the plugin (or the environment) names may declare settings of their own
            search_r1_configs(configs_from_source(options.plugin), os.environ)
            print(settings_table())
            return 0
        warnings = check_launch(options.plugin, train_args, os.environ)
    except (ConfigError, OSError, SyntaxError) as exc:
        print(f"launch_check: error: {exc}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"launch_check: warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
