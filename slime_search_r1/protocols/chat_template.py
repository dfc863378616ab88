"""Render the model's chat template ourselves so chat mode stays token-exact without a router.

The trajectory is `prompt ids + generated ids + follow-up ids + generated ids + ...`. Generated ids
are the engine's own, never rendered again; follow-up ids (the end of the assistant turn the model
did not write, the tool messages, the next generation prompt) are what the template writes after an
assistant message's content, read from two renders of the same conversation: without and with the
new messages. Only what follows the assistant content is compared: the template must end the turn
the same way in both, and write the new messages after it. What it writes before the content may
differ (Qwen3's templates render the last assistant turn with a thought block and drop it once a
tool message follows): the model's own tokens stand there. The new messages are rendered once more
with the real assistant message before them, and must come out the same: a template whose rendering
of them depends on what the model wrote is refused (ChatTemplateError).

Message contents are placed as the template writes them (as given, trimmed as Qwen3.5's and Llama's
templates trim them, or JSON-quoted as Llama's writes a tool result), and the delta is tokenized as
a chat server tokenizes the whole rendered conversation (split only at the template's added tokens),
so the observations trained on are the ones the served model meets.
"""

import copy
import json
import re
from functools import lru_cache

from jinja2 import TemplateError

from slime_search_r1.episode import RenderError, encode_text

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


def _after_assistant(rendered: str) -> str:
    """What a render writes after the placeholder assistant content."""
    return rendered[rendered.rindex(_ASSISTANT_SENTINEL) + len(_ASSISTANT_SENTINEL) :]


def _end_of_turn(tokenizer, rendered: str) -> tuple[str, int | None]:
    text = _after_assistant(rendered)
    special = set(tokenizer.all_special_ids)
    ids = encode_text(tokenizer, text, special_tokens_as_text=False)
    return text, next((i for i in ids if i in special), None)


class ChatTemplateError(RenderError):
    """The chat template cannot be extended turn by turn token-exactly, or refused to render the conversation
    (followup_ids says why): the sample ends FAILED with template_error."""


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

    def followup_ids(
        self,
        history: list[dict],
        new_messages: list[dict],
        generated_ids: list[int],
        assistant_message: dict | None = None,
    ) -> list[int]:
        """Ids to append after the model's turn: the rest of its end-of-turn, `new_messages`, the generation prompt.

        `history` is the conversation before the assistant turn the model just generated; `assistant_message`, that
        turn as recorded (the new messages must render the same after it as after a placeholder). Whatever the
        template raises (jinja2's TemplateError: its raise_exception, an undefined value) is a ChatTemplateError.
        """
        try:
            return self._followup_ids(history, new_messages, generated_ids, assistant_message)
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template refused to render the conversation: {exc}") from exc

    def _followup_ids(
        self, history: list[dict], new_messages: list[dict], generated_ids: list[int], assistant_message: dict | None
    ) -> list[int]:
        assistant = {"role": "assistant", "content": _ASSISTANT_SENTINEL}
        slots = [{**message, "content": _CONTENT_SLOT.format(i)} for i, message in enumerate(new_messages)]
        closing = _after_assistant(self.render([*history, assistant], add_generation_prompt=False))
        following = _after_assistant(self.render([*history, assistant, *slots], add_generation_prompt=True))
        if closing != self.end_of_turn_text or not following.startswith(closing):
            raise ChatTemplateError(
                f"the chat template ends an assistant turn with {closing!r} here and {self.end_of_turn_text!r} "
                f"after the prompt, or otherwise once messages follow it ({following[: len(closing) + 20]!r}), so "
                "turns cannot be appended token-exactly; use a template that ends every assistant turn alike"
            )
        real = _after_assistant(self.render([*history, assistant, *new_messages], add_generation_prompt=True))
        contents = self._placed_contents(following, real, new_messages)
        if assistant_message is not None:
            self._check_independent_of_turn(history, assistant_message, new_messages, real)
        written = _overlap(generated_ids, self.end_of_turn_ids)
        delta = self._unwritten_end_of_turn(written) + following[len(closing) :]
        return self._encode_rendered(delta, contents)

    def _placed_contents(self, slotted: str, real: str, new_messages: list[dict]) -> list[str]:
        """Each new message's content as the template wrote it in `real` (the render with the contents) where
        `slotted` (the render with slots) holds its slot: as given, trimmed, or JSON-quoted."""
        pieces = _SLOT_PATTERN.split(slotted)
        position, placed = len(pieces[0]), []
        if not real.startswith(pieces[0]):
            raise ChatTemplateError("the chat template renders the messages before their contents otherwise")
        for slot, after in zip(pieces[1::2], pieces[2::2], strict=True):
            content = str(new_messages[int(slot)].get("content") or "")
            quoted = json.dumps(content, ensure_ascii=False)[1:-1]
            ways = dict.fromkeys((content, content.strip(), quoted))
            found = next((way for way in ways if real.startswith(way + after, position)), None)
            if found is None:
                raise ChatTemplateError(
                    f"the chat template writes the content of a {new_messages[int(slot)].get('role')} message "
                    "otherwise than as given, trimmed or JSON-quoted, so its tokens cannot be placed exactly"
                )
            placed.append(found)
            position += len(found) + len(after)
        if position != len(real):
            raise ChatTemplateError("the chat template renders the new messages otherwise with their contents")
        return placed

    def _check_independent_of_turn(self, history, assistant_message, new_messages, expected: str) -> None:
        """The new messages render the same after the real assistant message as after the placeholder (a template
        that cannot render the real one raises: the conversation cannot go on)."""
        rendered = self.render([*history, assistant_message, *new_messages], add_generation_prompt=True)
        if not rendered.endswith(expected):
            raise ChatTemplateError(
                "the chat template renders the tool results or the next generation prompt otherwise after the "
                "model's own assistant message than after another, so the reply depends on history and cannot be "
                "appended token-exactly; use a template whose follow-ups do not depend on the assistant's text"
            )

    def _unwritten_end_of_turn(self, written: int) -> str:
        """The template's end-of-turn text after the first `written` of its ids (those the model generated)."""
        written_text = self.tokenizer.decode(self.end_of_turn_ids[:written], skip_special_tokens=False)
        if not self.end_of_turn_text.startswith(written_text):
            raise ChatTemplateError(
                f"the end of turn the model wrote ({written_text!r}) is not the start of the template's "
                f"{self.end_of_turn_text!r}"
            )
        return self.end_of_turn_text[len(written_text) :]

    def _encode_rendered(self, rendered: str, contents: list[str]) -> list[int]:
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
                run.append(contents[int(piece)])
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
