"""What the scripted stand-in writes: for each question, a search, then one call to every other tool the prompt offers,
then an answer; one action per turn, in Search-R1's tags (XML mode) or as a Qwen-style tool call (chat mode).

It reads everything from the context it is asked to continue, as a model would:
- the question: the prompt's "Question: ..." (model.py);
- the mode and the tools: chat mode when the chat template listed tools (<tools>, each with its schema), else XML
  mode, where a tool is offered when the instruction names its tag (<search>, and <calculator> once
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
from slime_search_r1.registry import TOOLS
from slime_search_r1.standin.model import ASSISTANT_MARKER, question_of, turn_index
from slime_search_r1.tools.contract import Tool

SEARCH = "search"
ANSWER = "answer"
INVALID_ACTION_END = "Let me try again."  # how Search-R1's invalid-action message ends (protocols/xml_tags.py)
TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)  # one schema a line (not "<tools></tools> tags")
FIRST_TITLE = re.compile(r"Doc 1\(Title: (.*?)\)(?:\(URL: [^)]*\))? ")
DEMO_SCRIPTS = {as_question(episode.question): episode.turns for episode in EPISODES}
UNKNOWN = "unknown"
BY_TYPE = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}  # a string is the question


def registered_tools() -> dict[str, Tool]:
    """Every tool the registry knows now: the built-ins and those the imported extensions registered."""
    return {name: TOOLS.get(name) for name in TOOLS.names()}


def offered_schemas(context_text: str) -> dict[str, dict] | None:
    """Chat mode: the tools the chat template listed, by name, with their parameters' schema; None in XML mode."""
    block = TOOLS_BLOCK.search(context_text)
    if block is None:
        return None
    offered = {}
    for line in block.group(1).splitlines():
        try:
            schema = json.loads(line)
        except json.JSONDecodeError:
            continue
        function = schema.get("function", schema) if isinstance(schema, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            offered[function["name"]] = function.get("parameters") or {}
    return offered


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
    """The scripted model: (the context it continues, special tokens kept) -> the text of its next turn."""

    def __init__(self, tools: Mapping[str, Tool] | None = None):
        self.tools = dict(tools) if tools is not None else registered_tools()
        self.observation_ends = (*{f"</{tool.result_tag}>" for tool in self.tools.values()}, INVALID_ACTION_END)

    def __call__(self, context_text: str) -> str:
        question = question_of(context_text)
        prompt = context_text.split(ASSISTANT_MARKER, 1)[0]
        schemas = offered_schemas(prompt)
        chat = schemas is not None
        if schemas is None:  # XML mode: the registered tools whose tag the instruction names
            schemas = {name: tool.parameters for name, tool in self.tools.items() if f"<{name}>" in prompt}
        steps = self.steps(question, schemas)
        step = steps[min(turn_index(context_text, self.observation_ends), len(steps) - 1)]
        kind, arguments = step
        if kind == ANSWER:
            answer = arguments if arguments is not None else first_title(context_text)
            return f"<think>A scripted turn: the answer.</think>\n<answer> {answer} </answer>"
        if chat:
            call = json.dumps({"name": kind, "arguments": arguments})
            return f"<think>A scripted turn: {kind}.</think>\n<tool_call>\n{call}\n</tool_call>"
        text = arguments.get(self.tools[kind].xml_argument, "")
        return f"<think>A scripted turn: {kind}.</think>\n<{kind}> {text} </{kind}>"

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


def first_title(context_text: str) -> str:
    """The title of the first document the last search returned in this episode, without its quotes."""
    reply = context_text.split(ASSISTANT_MARKER, 1)[-1]
    titles = FIRST_TITLE.findall(reply)
    return titles[-1].strip().strip('"') if titles else UNKNOWN
