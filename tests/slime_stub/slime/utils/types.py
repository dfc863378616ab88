"""Stand-in for slime.utils.types: the Sample dataclass and its response-append API.

Faithful to slime's behaviour where the plugin can see it: the same fields and defaults, top-p replay
arrays kept as torch int32 tensors, terminal meta_info (finish reason -> status, prefix-cache and
speculative-decoding counters, weight versions) and the same validation errors.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from slime.utils.misc import decode_int32_meta_array

_TOP_P_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _int32(values) -> torch.Tensor:
    return torch.as_tensor([] if values is None else values, dtype=torch.int32).reshape(-1)


def _top_p_spans(meta_info: dict, count: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The nucleus ids and offsets of `count` generated tokens, checked as slime checks them."""
    ids = decode_int32_meta_array(meta_info, _TOP_P_ID_KEYS)
    offsets = decode_int32_meta_array(meta_info, _TOP_P_OFFSET_KEYS)
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        raise ValueError("SGLang top-p token replay must include both token ids and offsets.")
    if offsets.numel() == 0 or int(offsets[0]) != 0:
        raise ValueError(f"SGLang top-p token offsets must start with 0, got {offsets[:1].tolist()}.")
    if int(offsets[-1]) != ids.numel():
        raise ValueError(
            f"SGLang top-p token ids/offsets mismatch: offsets[-1]={int(offsets[-1])}, len(token_ids)={ids.numel()}."
        )
    if offsets.numel() != count + 1:
        raise ValueError(
            "SGLang top-p token offsets length must equal generated token count + 1: "
            f"len(offsets)={offsets.numel()}, generated={count}."
        )
    return ids, offsets


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    # token i's nucleus is rollout_top_p_token_ids[offsets[i]:offsets[i + 1]] (torch int32 tensors once set)
    rollout_top_p_token_ids: list[int] | torch.Tensor | None = None
    rollout_top_p_token_offsets: list[int] | torch.Tensor | None = None
    rollout_routed_experts: list[list[int]] | torch.Tensor | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def add(self, meta_info: dict):
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict:
            return {
                "spec_accept_token_num": self.spec_accept_token_num,
                "spec_draft_token_num": self.spec_draft_token_num,
                "spec_verify_ct": self.spec_verify_ct,
                "completion_token_num": self.completion_token_num,
            }

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict):
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict:
            return {"cached_tokens": self.cached_tokens, "total_prompt_tokens": self.total_prompt_tokens}

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict:
        """What --save-debug-rollout-data saves: every attribute (a shallow copy), the status as its value and
        the two counter objects as dicts."""
        value = dict(self.__dict__)
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    def get_reward_value(self, args) -> float:
        return self.reward if not args.reward_key else self.reward[args.reward_key]

    @property
    def effective_response_length(self):
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

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

        trainable=True needs log probs; trainable=False must not get them (0.0 is recorded instead) and gets
        empty nucleus spans while top-p replay is on.
        """
        tokens = [int(t) for t in (tokens.tolist() if torch.is_tensor(tokens) else tokens or [])]
        if torch.is_tensor(log_probs):
            log_probs = log_probs.tolist()
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

        pad_top_p = bool(tokens and not trainable)
        if meta_info is not None or pad_top_p:
            self._apply_meta_info(args, meta_info or {}, len(tokens), pad_top_p, update_terminal_info)
        self._validate_lengths()

    def _apply_meta_info(self, args, meta_info: dict, count: int, pad_top_p: bool, update_terminal_info: bool):
        spans = _top_p_spans(meta_info, count) if count else None
        if spans is not None:
            ids, offsets = spans
            if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
                self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
            else:
                offsets_so_far = self.rollout_top_p_token_offsets
                base_offsets = _int32([0] if offsets_so_far is None else offsets_so_far)
                self.rollout_top_p_token_ids = torch.cat([_int32(self.rollout_top_p_token_ids), ids])
                self.rollout_top_p_token_offsets = torch.cat([base_offsets, offsets[1:] + int(base_offsets[-1])])
        elif pad_top_p and count and self.rollout_top_p_token_offsets is not None:
            if self.rollout_top_p_token_ids is None:
                raise ValueError("Cannot append empty top-p spans without existing token ids and offsets.")
            offsets = _int32(self.rollout_top_p_token_offsets)
            self.rollout_top_p_token_ids = _int32(self.rollout_top_p_token_ids)
            self.rollout_top_p_token_offsets = torch.cat([offsets, offsets.new_full((count,), int(offsets[-1]))])

        if not update_terminal_info or "finish_reason" not in meta_info:
            return
        if getattr(args, "sglang_speculative_algorithm", False):
            self.spec_info.add(meta_info=meta_info)
        self.prefix_cache_info.add(meta_info=meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        match meta_info["finish_reason"]["type"]:
            case "length":
                self.status = Sample.Status.TRUNCATED
            case "abort":
                self.status = Sample.Status.ABORTED
            case "stop":
                self.status = Sample.Status.COMPLETED

    def _validate_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
        if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
            return
        if self.rollout_top_p_token_ids is None or self.rollout_top_p_token_offsets is None:
            raise ValueError("rollout top-p replay must include both token ids and offsets.")
        offsets = _int32(self.rollout_top_p_token_offsets)
        if offsets.numel() != self.response_length + 1:
            raise ValueError(
                "rollout_top_p_token_offsets length must equal response_length + 1: "
                f"len(offsets)={offsets.numel()}, response_length={self.response_length}."
            )
        if int(offsets[-1]) != _int32(self.rollout_top_p_token_ids).numel():
            raise ValueError("rollout top-p token ids/offsets mismatch.")
