"""The model a launch trains (MODEL): what changes between model families in slime's shape, and nothing more.

Each family names slime's own scripts/models/<file>.sh (MODEL_ARGS_FILE's default: the launch sources it from
SLIME_DIR as slime's examples `source` it, so the architecture flags are slime's, never a copy), the checkpoints as
slime's examples name them (/root/<name> and /root/<name>_torch_dist: they replace the script's HF_CHECKPOINT and
REF_LOAD while those are the script's defaults) and the model family its template is placed in (registry.py's
MODEL_FAMILIES; families/detection.py places it at run time, and the tests check that the two agree), from which the
chat-template kwargs (--apply-chat-template-kwargs, which slime's template and the chat renderer both read) follow.

Thinking: Search-R1's prompt asks the model for a short <think>...</think> of its own before each search or answer.
A family whose template toggles thinking (its Thinking.toggle: Qwen3's and Qwen3.5's enable_thinking) gets it
False, so the model's native reasoning (thousands of tokens, where the whole multi-turn response has 2048) stays off
and the prompt is the same whichever way the checkpoint's template defaults (Qwen3.5 ships templates that default
either way). Qwen3-4B-Thinking-2507's template always opens the thought and has no switch; Qwen3-4B-Instruct-2507 and
Llama-3.2 do not think.
"""

from dataclasses import dataclass

from slime_search_r1.registry import MODEL_FAMILIES

# MODEL's default: the family run_qwen2.5_3B.sh's own paths are for.
DEFAULT_MODEL = "qwen2.5-3b"


@dataclass(frozen=True)
class ModelPreset:
    model_args_file: str  # under slime's scripts/models/
    checkpoint: str | None  # /root/<checkpoint> and /root/<checkpoint>_torch_dist; None: the script's own paths
    family: str  # the MODEL_FAMILIES entry whose rule places the checkpoint's chat template

    @property
    def chat_template_kwargs(self) -> dict:
        """The family's thinking switch turned off, where its template has one; nothing otherwise."""
        toggle = MODEL_FAMILIES.get(self.family).thinking.toggle
        return {toggle: False} if toggle else {}

    def paths(self) -> dict[str, str]:
        """The script's path variables this family sets (while they hold the script's defaults)."""
        if self.checkpoint is None:
            return {}
        return {"HF_CHECKPOINT": f"/root/{self.checkpoint}", "REF_LOAD": f"/root/{self.checkpoint}_torch_dist"}


MODEL_PRESETS = {
    DEFAULT_MODEL: ModelPreset("qwen2.5-3B.sh", None, "qwen25"),
    "llama-3.2-3b-instruct": ModelPreset("llama3.2-3B-Instruct.sh", "Llama-3.2-3B-Instruct", "llama3"),
    "qwen3-4b": ModelPreset("qwen3-4B.sh", "Qwen3-4B", "qwen3"),
    "qwen3-4b-instruct-2507": ModelPreset("qwen3-4B-Instruct-2507.sh", "Qwen3-4B-Instruct-2507", "qwen25"),
    # slime ships no file for the Thinking model: it has the Instruct-2507 architecture (rope theta 5,000,000)
    "qwen3-4b-thinking-2507": ModelPreset("qwen3-4B-Instruct-2507.sh", "Qwen3-4B-Thinking-2507", "qwen3_thinking"),
    "qwen3.5-4b": ModelPreset("qwen3.5-4B.sh", "Qwen3.5-4B", "qwen35"),
}
