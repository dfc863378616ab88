"""The machinery behind generate_with_search.py, grouped by the question each part answers.

config.py      what the user set: SEARCH_R1_CONFIGS, its environment overrides, the slime flags it needs
loop.py        how one episode runs: the loop every mode shares, and how an episode ends
state.py       what one episode knows: the EpisodeState the loop owns, the counters it records
trajectory.py  what the episode records on the sample: tokens, loss mask, log probs (the only writer)
tokens/        where a turn's tokens come from: SGLang (manual), or the old slime router's cache
protocols/     what the model writes and is shown: XML tags, chat tool calls, the tools by name
search/        how a query becomes passages: backends by name, the local retriever client
training/      what slime does with finished samples: group advantages, search metrics in its logs
evaluation/    evaluate.py's data files and reports
data.py        Search-R1's prompts, labels and test sets
http.py        aiohttp plumbing shared by the engine and search clients
"""
