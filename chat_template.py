"""Render the model's chat template ourselves so chat mode stays token-exact without a router.

The trajectory is `prompt ids + generated ids + follow-up ids + generated ids + ...`. Generated ids
are the engine's own; follow-up ids (the end of the assistant turn the model did not write, the tool
messages, the next generation prompt) are the template's delta between two renders of the same
conversation: without and with the new messages. The earlier render is checked to be a true prefix
of the later one (both end the assistant turn the same way, and neither adds a generation prompt
before the new messages), so the delta is exactly what the template puts there.
"""

import copy
import json
import re

from observations import encode_text

_ASSISTANT_SENTINEL = "\ue000search-r1-assistant-turn\ue001"
_CONTENT_SLOT = "\ue000search-r1-slot-{}\ue001"
_SLOT_PATTERN = re.compile("\ue000search-r1-slot-(\\d+)\ue001")


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
        self.end_of_turn_text = rendered[rendered.rindex(_ASSISTANT_SENTINEL) + len(_ASSISTANT_SENTINEL) :]
        self.end_of_turn_ids = encode_text(tokenizer, self.end_of_turn_text, special_tokens_as_text=False)
        # The special token that ends an assistant turn (a stop token for generation), if the template has one.
        special = set(tokenizer.all_special_ids)
        self.end_of_turn_token = next((i for i in self.end_of_turn_ids if i in special), None)

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
        closing = self.end_of_turn_ids
        already = _overlap(generated_ids, closing)
        return closing[already:] + self._encode_with_contents(after[len(before) :], new_messages)

    def _encode_with_contents(self, delta: str, new_messages: list[dict]) -> list[int]:
        # Template text keeps its special tokens; message contents (search results) are encoded as plain text.
        ids: list[int] = []
        pieces = _SLOT_PATTERN.split(delta)
        for index, piece in enumerate(pieces):
            if index % 2:
                ids += encode_text(self.tokenizer, str(new_messages[int(piece)].get("content") or ""))
            elif piece:
                ids += encode_text(self.tokenizer, piece, special_tokens_as_text=False)
        return ids


def _overlap(generated: list[int], closing: list[int]) -> int:
    """The longest k with generated[-k:] == closing[:k] (the model already wrote the start of the closing)."""
    for k in range(min(len(generated), len(closing)), 0, -1):
        if generated[-k:] == closing[:k]:
            return k
    return 0
