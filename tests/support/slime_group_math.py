"""slime's own reward post-processing (RolloutManager._post_process_rewards), callable as f(args, samples).

slime.ray.rollout cannot be imported without ray and SGLang, so the method is read out of the source file of
the slime under test (a real checkout with SLIME_SRC, else the stand-in) and run as it is written there.
"""

import ast
import functools
import types

import torch

from support.slime_compat import slime_root


@functools.cache
def _method_source() -> ast.Module:
    path = slime_root() / "slime" / "ray" / "rollout.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    manager = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RolloutManager")
    method = next(n for n in manager.body if isinstance(n, ast.FunctionDef) and n.name == "_post_process_rewards")
    return ast.fix_missing_locations(ast.Module(body=[method], type_ignores=[]))


def slime_post_process_rewards(args, samples) -> tuple[list[float], list[float]]:
    """(raw rewards, rewards) exactly as slime's RolloutManager computes them without a custom hook."""
    from slime.utils.types import Sample  # the method's annotations name it

    namespace = {"torch": torch, "Sample": Sample}
    exec(compile(_method_source(), "slime/ray/rollout.py", "exec"), namespace)
    manager = types.SimpleNamespace(args=args, custom_reward_post_process_func=None)
    return namespace["_post_process_rewards"](manager, samples)
