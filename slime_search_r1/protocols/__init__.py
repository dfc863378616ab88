"""What the model writes and what it is shown: Search-R1's XML tags, chat tool calls, the tools by name."""
