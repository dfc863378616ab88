"""What the model may call: the tool contract, and the built-in tools with the clients that answer them.

contract.py  a Tool (name, description, arguments, how it runs, what the prompt and hints say of it), how it fails,
             and its calls: read with the tool, run with per-tool counters (the loop's only way in)
search.py    `search`: Search-R1's passages from the configured search backend (the local retriever's client here)
access.py    `access`: ASearcher's pages from the local retriever's /access (off by default)
A new tool is one file: a Tool registered in registry.TOOLS, enabled with the `tools` setting.
"""
