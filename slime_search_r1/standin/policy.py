"""What the scripted stand-in writes: for each question, a search, then one call to every other tool the prompt offers,
then an answer; one action per turn, in Search-R1's tags (XML mode) or as a tool call in the model family's format
(chat mode: slime_search_r1/families, the family the tokenizer's chat template is placed in), with a thought where
the family's generation prompt leaves one to write.

It reads everything from the context it is asked to continue, as a model would:
- the question: the prompt's "Question: ..." (model.py);
- the mode and the tools: chat mode when the chat template listed tools (the JSON schema of each), else XML mode,
  where a tool is offered when the instruction names its tag (<search>, and <calculator> once
  examples/calculator.py's prompt line is there); a tool's XML tag, argument and result tag come from the registry
  (slime_search_r1/registry.py), extensions included;
- the turn: how many it took already (model.py's turn_index over the tools' result tags).
The demo's ten questions (slime_search_r1/demo/scripts.py) follow their scripts: their queries and their answers,
one wrong on purpose. Any other question is searched as it is written and answered with the title of the first
document the search returned ("unknown" when it returned none). A tool other than search is called with the
arguments its schema shows: each required property's first `examples` entry or its `default`, else the question
for a string (1 for a number, true for a boolean).
"""

import json
import re
from collections.abc import Mapping

from slime_search_r1.data import as_question
from slime_search_r1.demo.scripts import EPISODES
from slime_search_r1.families import THINK_TAGS, ModelFamily
from slime_search_r1.protocols.xml_tags import prompt_thought
from slime_search_r1.registry import TOOLS
from slime_search_r1.standin.model import assistant_marker, question_of, turn_index
from slime_search_r1.tools.contract import Tool

SEARCH = "search"
ANSWER = "answer"
INVALID_ACTION_END = "Let me try again."  # how Search-R1's invalid-action message ends (protocols/xml_tags.py)
FIRST_TITLE = re.compile(r"Doc 1\(Title: (.*?)\)(?:\(URL: [^)]*\))? ")
DEMO_SCRIPTS = {as_question(episode.question): episode.turns for episode in EPISODES}
UNKNOWN = "unknown"
BY_TYPE = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}  # a string is the question


def registered_tools() -> dict[str, Tool]:
    """Every tool the registry knows now: the built-ins and those the imported extensions registered."""
    return {name: TOOLS.get(name) for name in TOOLS.names()}


def offered_schemas(prompt_text: str) -> dict[str, dict] | None:
    """Chat mode: the tools the chat template listed, by name, with their parameters' schema, found as the JSON
    function schemas it rendered (one a line in Qwen's <tools>, indented in Llama's user turn); None in XML mode."""
    offered, decoder, position = {}, json.JSONDecoder(), prompt_text.find("{")
    while position >= 0:
        try:
            value, end = decoder.raw_decode(prompt_text, position)
        except json.JSONDecodeError:
            end = position + 1
        else:
            function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                offered[function["name"]] = function.get("parameters") or {}
            else:
                end = position + 1  # look inside it
        position = prompt_text.find("{", end)
    return offered or None


def example_arguments(parameters: dict, question: str) -> dict:
    """Arguments a schema accepts: each required property (every property when none is required) from its first
    `examples` entry or its `default`, else the question for a string, 1 for a number, true for a boolean."""
    properties = parameters.get("properties") or {}
    names = parameters.get("required") or list(properties)
    arguments = {}
    for name in names:
        schema = properties.get(name) or {}
        if schema.get("examples"):
            arguments[name] = schema["examples"][0]
        elif "default" in schema:
            arguments[name] = schema["default"]
        else:
            arguments[name] = BY_TYPE.get(schema.get("type", "string"), question)
    return arguments


class StandInPolicy:
    """The scripted model: (the context it continues, special tokens kept) -> the text of its next turn; `family`
    (None: Qwen2.5's) writes its chat-mode calls and thoughts."""

    def __init__(self, tools: Mapping[str, Tool] | None = None, family: ModelFamily | None = None):
        self.tools = dict(tools) if tools is not None else registered_tools()
        self.family = family
        self.observation_ends = (*{f"</{tool.result_tag}>" for tool in self.tools.values()}, INVALID_ACTION_END)

    def __call__(self, context_text: str) -> str:
        question = question_of(context_text)
        prompt = context_text.split(assistant_marker(context_text), 1)[0]
        schemas = offered_schemas(prompt)
        chat = schemas is not None
        if schemas is None:  # XML mode: the registered tools whose tag the instruction names
            schemas = {name: tool.parameters for name, tool in self.tools.items() if f"<{name}>" in prompt}
        steps = self.steps(question, schemas)
        step = steps[min(turn_index(context_text, self.observation_ends), len(steps) - 1)]
        kind, arguments = step
        thought = "A scripted turn: the answer." if kind == ANSWER else f"A scripted turn: {kind}."
        thought = self.thought(context_text, thought) if chat else f"<think>{thought}</think>\n"
        if kind == ANSWER:
            answer = arguments if arguments is not None else first_title(context_text)
            return f"{thought}<answer> {answer} </answer>"
        if chat:
            return thought + call_text(self.family, kind, arguments)
        text = arguments.get(self.tools[kind].xml_argument, "")
        return f"{thought}<{kind}> {text} </{kind}>"

    def thought(self, context_text: str, text: str) -> str:
        """A thought as the model writes it after this generation prompt: whole, only its end when the prompt
        opened it, none after the empty one a prompt with thinking off holds (families/__init__.py)."""
        if self.family is None:
            return f"<think>{text}</think>\n"
        opening, closing = THINK_TAGS
        state = prompt_thought(context_text)
        if state == "open":
            return f"{text}\n{closing}\n\n"
        return "" if state == "closed" else f"{opening}{text}{closing}\n"

    def steps(self, question: str, schemas: Mapping[str, dict]) -> list[tuple[str, object]]:
        """(tool name, its arguments) per call, then (ANSWER, the answer or None to answer what the search found)."""
        scripted = DEMO_SCRIPTS.get(question, ((SEARCH, question.removesuffix("?")), (ANSWER, None)))
        steps: list[tuple[str, object]] = []
        for kind, text in scripted:
            if kind == SEARCH and SEARCH in schemas:
                steps.append((SEARCH, {**example_arguments(schemas[SEARCH], question), "query": text}))
        for name, parameters in schemas.items():
            if name != SEARCH:
                steps.append((name, example_arguments(parameters, question)))
        steps.append(scripted[-1])
        return steps


def call_text(family: ModelFamily | None, name: str, arguments: dict) -> str:
    """One call as the family's model writes it, the way its SGLang --tool-call-parser reads it: Qwen's JSON in
    <tool_call> (None: Qwen2.5), <function=...><parameter=...> (qwen3_coder), or Llama 3's JSON with "parameters",
    after <|python_tag|> (the model's text comes first)."""
    parser = family.tool_call_parser if family is not None else "qwen25"
    if parser == "qwen3_coder":
        values = {key: value if isinstance(value, str) else json.dumps(value) for key, value in arguments.items()}
        parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in values.items())
        return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"
    if parser == "llama3":
        return "<|python_tag|>" + json.dumps({"name": name, "parameters": arguments})
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def first_title(context_text: str) -> str:
    """The title of the first document the last search returned in this episode, without its quotes (nor the
    backslashes before them where a template shows the result as a JSON string)."""
    reply = context_text.split(assistant_marker(context_text), 1)[-1]
    titles = FIRST_TITLE.findall(reply)
    return titles[-1].strip().strip('\\"') if titles else UNKNOWN  # quoted, or JSON-escaped in Llama's tool turn
