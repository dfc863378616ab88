"""How a query becomes passages: search backends by name, the local retriever client, Search-R1's text."""
