"""Calls wrapped in `<tool_call>…</tool_call>` blocks, read block by block (the qwen25 and qwen3_coder formats).

The text before the first `<tool_call>` is the turn's content; only whitespace and further calls may follow the first
call: anything else there (an invented tool response, an answer, a broken call) is kept as text after the calls, for
the reward's format rule. A block its format cannot read, and an unclosed `<tool_call>`, are unparsable, with why.
"""

import re
from collections.abc import Callable

from slime_search_r1.families import CallsRead

OPEN, CLOSE = "<tool_call>", "</tool_call>"
BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

# (the text between the tags) -> its calls as (name, arguments), or why it is not a call
BlockReader = Callable[[str], "list[tuple[object, object]] | str"]


def read_blocks(text: str, read_block: BlockReader, *, unclosed_read: bool = False) -> CallsRead:
    """The turn's content, calls and unparsable blocks. `unclosed_read`: a `<tool_call>` that is never closed is read
    to the end of the turn (SGLang's qwen3_coder detector does, when no block is closed); else it is unparsable."""
    first = text.find(OPEN)
    if first < 0:
        return CallsRead(text.rstrip("\n"))
    turn = CallsRead(text[:first].rstrip("\n"))
    rest, leftover, position = text[first:], [], 0
    blocks = list(BLOCK.finditer(rest))
    for match in blocks:
        read = read_block(match.group(1))
        if isinstance(read, str):
            turn.unparsable.append((match.group(1), read))
            continue
        turn.calls += read
        leftover.append(rest[position : match.start()])
        position = match.end()
    if rest.count(OPEN) > rest.count(CLOSE):  # an unclosed call
        tail = rest[rest.rfind(OPEN) :]
        read = read_block(tail[len(OPEN) :]) if unclosed_read and not blocks else "an unclosed <tool_call>"
        if isinstance(read, str):
            turn.unparsable.append((tail, read))
        else:
            turn.calls += read
            leftover.append(rest[position : rest.rfind(OPEN)])
            position = len(rest)
    leftover.append(rest[position:])
    turn.text_after_calls = "".join(leftover).strip()
    return turn
