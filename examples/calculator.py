"""An extension in one file: a calculator the model may call beside search.

    export PYTHONPATH=$PWD/examples:$PYTHONPATH               # where this file is (the launch scripts pass it on)
    export SEARCH_R1_EXTENSIONS=calculator SEARCH_R1_TOOLS=search,calculator

XML mode: the model writes <calculator> 2 * (3 + 4) </calculator> and is shown the value between <result> and
</result>; chat mode: it calls calculator({"expression": "2 * (3 + 4)"}) and gets a tool message. Its results are not
retrieved text (retrieves=False), so a value that happens to be the gold answer earns no retrieval bonus. The data
script offers it to chat rows once it is imported:

    python oai_format_data_preprocess.py --input test.parquet --output test_chat.parquet \
        --tools search,calculator --extensions calculator

Nothing under slime_search_r1/ changes: the prompt line, the invalid-action message, the stop string, the chat schema,
the format rule and the metrics all come from this Tool.
"""

import ast
import operator

from slime_search_r1.registry import TOOLS
from slime_search_r1.tools.contract import Tool

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 100


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * / **, parentheses); ValueError for anything else."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"an exponent above {MAX_EXPONENT} is refused")
            return _OPERATORS[type(node.op)](left, right)
        raise ValueError("only numbers, + - * / ** and parentheses are understood")

    try:
        return value(ast.parse(expression, mode="eval").body)
    except SyntaxError:
        raise ValueError(f"{expression!r} is not an arithmetic expression") from None
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def read_arguments(arguments: dict) -> dict:
    expression = arguments.get("expression")
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("'expression' must be a non-empty string")
    return {"expression": expression.strip()}


async def run(arguments: dict, state) -> str:
    try:
        result = evaluate(arguments["expression"])
    except ValueError as exc:
        return f"Error: {exc}"  # the model is shown what was wrong; the sample goes on
    return f"{arguments['expression']} = {result:g}"


CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression: numbers, + - * / ** and parentheses.",
    parameters={
        "type": "object",
        # `examples`: what the scripted stand-in (python -m slime_search_r1.standin) calls it with
        "properties": {
            "expression": {
                "type": "string",
                "description": "The expression, e.g. 2 * (3 + 4).",
                "examples": ["2 * (3 + 4)"],
            }
        },
        "required": ["expression"],
    },
    read_arguments=read_arguments,
    run=run,
    usage='Call calculator with {"expression": "..."}.',
    xml_argument="expression",
    xml_usage="If I want to calculate, I should put the expression between <calculator> and </calculator>.",
    observation_budget=lambda config: 32,
    prompt_line="You can calculate by <calculator> expression </calculator>, and the value will be returned between "
    "<result> and </result>.",
    result_tag="result",
    retrieves=False,
)
TOOLS.register("calculator", CALCULATOR)
