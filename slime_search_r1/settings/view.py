"""The read-only view of resolved settings the rollout and the launch read: `config.max_turns`,
`config.local.search_url`, `knobs.num_gpus`. Each value is a plain attribute, so reading one runs no code here."""

from typing import Any


class Section:
    """Read-only settings as attributes; the names in `hidden` (secrets) never appear in the repr."""

    def __init__(self, values: dict[str, Any], hidden: frozenset[str] = frozenset()):
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_hidden", hidden)

    def __getattr__(self, name: str) -> Any:  # only for a name that is not a setting
        raise AttributeError(f"no setting {name!r} here; there are {', '.join(self._values)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("settings are read-only; change SEARCH_R1_CONFIGS (or the environment) instead")

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'<hidden>' if k in self._hidden else repr(v)}" for k, v in self._values.items())
        return f"{type(self).__name__}({shown})"


class SearchR1Config(Section):
    """Every plugin setting, checked (resolve_config builds it); `train_observations`: LOSS_MASK_MODE=simple."""

    def __init__(self, values: dict[str, Any], hidden: frozenset[str] = frozenset()):
        super().__init__(values, hidden)
        object.__setattr__(self, "train_observations", values["loss_mask_mode"] == "simple")
