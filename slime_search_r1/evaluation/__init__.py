"""evaluate.py's parts: reading a test file into slime Samples, and its reports (Markdown, JSON, charts)."""
