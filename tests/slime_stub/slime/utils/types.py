"""Stand-in for slime.utils.types: the Sample dataclass and its response-append API."""

import base64
from array import array
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

_TOP_P_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _int32_meta_array(meta_info: dict, keys: tuple[str, ...]) -> list[int] | None:
    """slime's decode_int32_meta_array: the first key present; base64 of native int32, bytes or a list."""
    value = next((meta_info[k] for k in keys if k in meta_info), None)
    if value is None:
        return None
    if isinstance(value, str):
        value = base64.b64decode(value.encode("ascii"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return array("i", bytes(value)).tolist()
    return [int(v) for v in value]


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict):
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)
    train_metadata: dict | None = None
    session_id: str | None = None

    def get_reward_value(self, args) -> float:
        return self.reward if not args.reward_key else self.reward[args.reward_key]

    def append_response_tokens(
        self,
        args=None,
        *,
        tokens=None,
        log_probs=None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ):
        """Append response tokens with their loss mask, log probs and top-p spans, as slime does.

        trainable=True needs log probs; trainable=False must not get them (0.0 is recorded instead).
        """
        tokens = [int(t) for t in (tokens or [])]
        log_probs = None if log_probs is None else [float(v) for v in log_probs]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            log_probs = [0.0] * len(tokens)

        if text is not None:
            self.response += text

        previous_length = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * previous_length
            self.loss_mask += [1 if trainable else 0] * len(tokens)

        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and previous_length:
                    raise ValueError(
                        "Cannot append trainable rollout log probabilities to a sample with existing response "
                        "tokens but no existing rollout_log_probs."
                    )
                self.rollout_log_probs = [0.0] * previous_length
            self.rollout_log_probs += log_probs

        if tokens:
            self._extend_top_p_spans(meta_info or {}, len(tokens), trainable)
        if meta_info is not None and update_terminal_info and "finish_reason" in meta_info:
            self.prefix_cache_info.add(meta_info)
            if "weight_version" in meta_info:
                self.weight_versions.append(meta_info["weight_version"])
            match meta_info["finish_reason"]["type"]:
                case "length":
                    self.status = Sample.Status.TRUNCATED
                case "abort":
                    self.status = Sample.Status.ABORTED
                case "stop":
                    self.status = Sample.Status.COMPLETED
        self._validate_lengths()

    def _extend_top_p_spans(self, meta_info: dict, count: int, trainable: bool) -> None:
        ids, offsets = _int32_meta_array(meta_info, _TOP_P_ID_KEYS), _int32_meta_array(meta_info, _TOP_P_OFFSET_KEYS)
        if (ids is None) != (offsets is None):
            raise ValueError("SGLang top-p token replay must include both token ids and offsets.")
        if ids is not None:
            if len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
                raise ValueError("SGLang top-p token offsets do not match the generated tokens.")
            if self.rollout_top_p_token_offsets is None:
                self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = list(ids), list(offsets)
            else:
                base = self.rollout_top_p_token_offsets[-1]
                self.rollout_top_p_token_ids += list(ids)
                self.rollout_top_p_token_offsets += [base + o for o in offsets[1:]]
        elif not trainable and self.rollout_top_p_token_offsets is not None:
            # tool tokens get empty nucleus spans
            self.rollout_top_p_token_offsets += [self.rollout_top_p_token_offsets[-1]] * count

    def _validate_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
        offsets, expected = self.rollout_top_p_token_offsets, self.response_length + 1
        if offsets is not None and len(offsets) != expected:
            raise ValueError(f"rollout_top_p_token_offsets length {len(offsets)} != response_length + 1 = {expected}")
