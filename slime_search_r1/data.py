"""Search-R1's data: the prompts its rows carry, the gold answers in their labels, its test sets.

Search-R1's parquet rows hold `prompt` (the instruction below, wrapped in the user turn), `reward_model`
({"style": "rule", "ground_truth": {"target": [...]}}) and `data_source`; oai_format_data_preprocess.py turns
them into chat-format rows (the system prompt and question below, and the tool list).
"""

# Search-R1's seven test sets, in the order of its paper's tables.
SEARCH_R1_DATA_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")

SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


def as_question(text: str) -> str:
    """Stripped, ending in `?`, as Search-R1's data scripts write questions."""
    text = text.strip()
    return text if text.endswith("?") else text + "?"


def search_r1_prompt(question: str) -> str:
    """The user-turn text Search-R1's data scripts write ("as your want" is theirs)."""
    return SEARCH_R1_INSTRUCTION.format(question=as_question(question))


CHAT_SYSTEM_PROMPT = (
    "You are a helpful assistant that answers questions with the help of a search tool. Reason step by step "
    "inside <think> and </think> every time you get new information. If you lack some knowledge, call the "
    "search tool; you can call it as many times as you want. When no further knowledge is needed, give the "
    "final answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>."
)


def chat_system_prompt(tools=("search",)) -> str:
    """The chat data's system prompt for the enabled tools, by name: with search alone CHAT_SYSTEM_PROMPT, word for
    word; with others (access, a tool of your own) it names every one of them."""
    tools = list(tools)
    if tools == ["search"]:
        return CHAT_SYSTEM_PROMPT
    named = tools[0] if len(tools) == 1 else f"{', '.join(tools[:-1])} and {tools[-1]}"
    several = len(tools) > 1
    return (
        f"You are a helpful assistant that answers questions with the help of "
        f"{f'the {named} tools' if several else f'a {named} tool'}. Reason step by step inside <think> and </think> "
        "every time you get new information. If you lack some knowledge or need what a tool gives, call "
        f"{'one of the tools' if several else f'the {named} tool'}; you can call {'them' if several else 'it'} as "
        "many times as you want. When no further knowledge is needed, give the final answer inside <answer> and "
        "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>."
    )


def chat_question(question: str) -> str:
    """The user turn of the chat-format data (the question gets a `?` like Search-R1's)."""
    return f"Question: {as_question(question)}"


def golden_answers(label) -> list[str]:
    """Gold answers from slime's label in any of its shapes.

    Accepted: the reward_model dict {"style": ..., "ground_truth": {"target": [...]}}, {"ground_truth": ...},
    {"target": ...}, or the targets themselves; targets may be a list, tuple, numpy array or one string.
    """
    node = label
    if isinstance(node, dict) and "ground_truth" in node:
        node = node["ground_truth"]
    if isinstance(node, dict):
        if "target" not in node:
            raise ValueError(
                f"label has no 'target' (keys: {sorted(node)}); expected {{'ground_truth': {{'target': [...]}}}}"
            )
        node = node["target"]
    if hasattr(node, "tolist"):  # numpy arrays from parquet
        node = node.tolist()
    if isinstance(node, (str, int, float)) and not isinstance(node, bool):
        return [str(node)]
    if isinstance(node, (list, tuple)) and node and all(isinstance(x, (str, int, float)) for x in node):
        return [str(x) for x in node]
    raise ValueError(
        f"cannot read gold answers from label {str(label)[:200]!r}; expected {{'ground_truth': {{'target': [...]}}}}, "
        "a list of strings or a string"
    )
