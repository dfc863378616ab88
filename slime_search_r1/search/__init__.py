"""Search backends of their own beyond the local retriever (tools/search.py holds that one): google.py, serper.dev."""
