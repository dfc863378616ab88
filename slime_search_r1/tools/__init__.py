"""What the model may call: the tool contract, the calls made with it, and the built-in tools.

contract.py  a Tool: its name, description, arguments, how it runs, and the lines it adds to the prompt and hints
calls.py     reading a call with its tool, and running calls with per-tool counters (the loop's only way in)
search.py    `search`: Search-R1's passages from the configured search backend
A new tool is one file: a Tool registered in registry.TOOLS, enabled with the `tools` setting.
"""
