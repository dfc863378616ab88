"""Render the model's chat template ourselves so chat mode stays token-exact without a router.

The trajectory is `prompt ids + generated ids + follow-up ids + generated ids + ...`. Generated ids
are the engine's own; follow-up ids (the end of the assistant turn the model did not write, the tool
messages, the next generation prompt) are the template's delta between two renders of the same
conversation: without and with the new messages. The earlier render is checked to be a true prefix
of the later one (both end the assistant turn the same way, and neither adds a generation prompt
before the new messages), so the delta is exactly what the template puts there. The delta is
tokenized as a chat server tokenizes the whole rendered conversation (split only at the template's
added tokens), so the observations trained on are the ones the served model meets.
"""

import copy
import json
import re
from functools import lru_cache

from slime_search_r1.episode import encode_text

_ASSISTANT_SENTINEL = "\ue000search-r1-assistant-turn\ue001"
_CONTENT_SLOT = "\ue000search-r1-slot-{}\ue001"
_SLOT_PATTERN = re.compile("\ue000search-r1-slot-(\\d+)\ue001")


def chat_template_kwargs(args, sample) -> dict:
    """slime's --apply-chat-template-kwargs with the sample's own on top (slime itself never fills the sample's)."""
    return {**(getattr(args, "apply_chat_template_kwargs", None) or {}), **(sample.apply_chat_template_kwargs or {})}


def turn_stop_ids(sampling_params: dict, tokenizer, end_of_turn_token: int | None) -> list[int]:
    """The request's stop_token_ids plus what ends a model turn whatever model serves it: the chat template's
    end-of-turn token (<|im_end|>, where a template frames the turns) and the tokenizer's EOS. SGLang stops at its
    served model's EOS set as well, which for a base model (Qwen2.5-3B: <|endoftext|> alone) lacks <|im_end|>."""
    ids = list(sampling_params.get("stop_token_ids") or [])
    for token in (end_of_turn_token, tokenizer.eos_token_id):
        if token is not None and token not in ids:
            ids.append(token)
    return ids


def template_end_of_turn(tokenizer, template_kwargs: dict | None = None) -> tuple[str, int | None]:
    """(the text a chat template writes after an assistant message, its special token) for the tokenizer's template;
    ("", None) when the tokenizer has none."""
    return _template_end_of_turn(tokenizer, json.dumps(template_kwargs or {}, sort_keys=True, default=str))


@lru_cache(maxsize=16)
def _template_end_of_turn(tokenizer, template_kwargs: str) -> tuple[str, int | None]:
    if not getattr(tokenizer, "chat_template", None):
        return "", None
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _ASSISTANT_SENTINEL}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, **json.loads(template_kwargs))
    return _end_of_turn(tokenizer, rendered)


def _end_of_turn(tokenizer, rendered: str) -> tuple[str, int | None]:
    text = rendered[rendered.rindex(_ASSISTANT_SENTINEL) + len(_ASSISTANT_SENTINEL) :]
    special = set(tokenizer.all_special_ids)
    ids = encode_text(tokenizer, text, special_tokens_as_text=False)
    return text, next((i for i in ids if i in special), None)


class ChatTemplateError(RuntimeError):
    """The chat template cannot be extended turn by turn (its earlier render is not a prefix of the later)."""


def template_messages(messages: list[dict]) -> list[dict]:
    """A copy for the template: tool-call arguments as objects, as HF templates (and SGLang) expect."""
    rendered = copy.deepcopy(messages)
    for message in rendered:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except json.JSONDecodeError:
                    pass
    return rendered


class ChatRenderer:
    def __init__(self, tokenizer, tools: list[dict], template_kwargs: dict | None, prompt_messages: list[dict]):
        self.tokenizer = tokenizer
        self.tools = tools
        self.template_kwargs = dict(template_kwargs or {})
        # What the template writes after an assistant message's content, e.g. "<|im_end|>\n" for ChatML.
        rendered = self.render([*prompt_messages, {"role": "assistant", "content": _ASSISTANT_SENTINEL}], False)
        # and the special token that ends an assistant turn (a stop token for generation), if the template has one
        self.end_of_turn_text, self.end_of_turn_token = _end_of_turn(tokenizer, rendered)
        self.end_of_turn_ids = encode_text(tokenizer, self.end_of_turn_text, special_tokens_as_text=False)
        # Where a chat server's tokenizer splits rendered text: every added token (special or not), longest first.
        self.markers: dict[str, int] = tokenizer.get_added_vocab()
        alternatives = "|".join(re.escape(token) for token in sorted(self.markers, key=len, reverse=True))
        self.marker_pattern = re.compile(f"({alternatives})") if alternatives else None

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            template_messages(messages),
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def followup_ids(self, history: list[dict], new_messages: list[dict], generated_ids: list[int]) -> list[int]:
        """Ids to append after the model's turn: the rest of its end-of-turn, `new_messages`, the generation prompt.

        `history` is the conversation before the assistant turn the model just generated.
        """
        assistant = {"role": "assistant", "content": _ASSISTANT_SENTINEL}
        slots = [{**message, "content": _CONTENT_SLOT.format(i)} for i, message in enumerate(new_messages)]
        before = self.render([*history, assistant], add_generation_prompt=False)
        after = self.render([*history, assistant, *slots], add_generation_prompt=True)
        if not after.startswith(before):
            raise ChatTemplateError(
                "the chat template renders a conversation differently once messages follow the assistant turn, "
                "so turns cannot be appended token-exactly; use a template whose earlier render is a prefix of "
                "the later one (ChatML/Qwen2.5 templates are)"
            )
        written = _overlap(generated_ids, self.end_of_turn_ids)
        return self._encode_rendered(self._unwritten_end_of_turn(written) + after[len(before) :], new_messages)

    def _unwritten_end_of_turn(self, written: int) -> str:
        """The template's end-of-turn text after the first `written` of its ids (those the model generated)."""
        written_text = self.tokenizer.decode(self.end_of_turn_ids[:written], skip_special_tokens=False)
        if not self.end_of_turn_text.startswith(written_text):
            raise ChatTemplateError(
                f"the end of turn the model wrote ({written_text!r}) is not the start of the template's "
                f"{self.end_of_turn_text!r}"
            )
        return self.end_of_turn_text[len(written_text) :]

    def _encode_rendered(self, rendered: str, new_messages: list[dict]) -> list[int]:
        """Ids of template text with content slots, as a chat server tokenizes the rendered conversation.

        The template's own added tokens (<|im_start|>, <|im_end|>, ...) become their ids; each run of text between
        them, template text and message contents together, is tokenized as one string, because that is what the
        policy meets when served behind /v1/chat/completions. Text in a content that looks like a special token
        stays text: a retrieved page cannot end the turn.
        """
        ids: list[int] = []
        run: list[str] = []
        for index, piece in enumerate(_SLOT_PATTERN.split(rendered)):
            if index % 2:
                run.append(str(new_messages[int(piece)].get("content") or ""))
                continue
            for part_index, part in enumerate(self._split_at_markers(piece)):
                if part_index % 2:
                    ids += encode_text(self.tokenizer, "".join(run))
                    run = []
                    ids.append(self.markers[part])
                elif part:
                    run.append(part)
        return ids + encode_text(self.tokenizer, "".join(run))

    def _split_at_markers(self, template_text: str) -> list[str]:
        """[text, marker, text, marker, ..., text]: the template text split at the tokenizer's added tokens."""
        return self.marker_pattern.split(template_text) if self.marker_pattern else [template_text]


def _overlap(generated: list[int], closing: list[int]) -> int:
    """The longest k with generated[-k:] == closing[:k] (the model already wrote the start of the closing)."""
    for k in range(min(len(generated), len(closing)), 0, -1):
        if generated[-k:] == closing[:k]:
            return k
    return 0
