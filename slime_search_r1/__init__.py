"""The machinery behind generate_with_search.py, grouped by the question each part answers.

settings/        what the user set: every setting declared once, SEARCH_R1_CONFIGS and the environment variables
registry.py      what can be added by name: protocols, token-tracking modes, tools, search backends
slime_flags.py   which slime flags the settings must agree with
launch/          what the launch scripts hand to Python: the values and their sources, the same checks on the launch
                 command before Ray starts, Ray and the job, the tmux wrapper (`python -m slime_search_r1.launch`)
loop.py          how one episode runs: the loop every mode shares, how an episode ends, and the map of the files one
                 turn passes through (its docstring: read it first)
episode.py       what one episode is made of, knows and leaves: Turn, Action, Reply, the EpisodeState, and its record
                 in sample.metadata["search_r1"] (how to read it back too)
tokens/          where a turn's tokens come from: SGLang with the trajectory written turn by turn (manual.py; the
                 /generate call and its answer read in engine.py, SGLang's rules in engine_rules.py: where a turn
                 ends, which lengths it accepts), or the old slime router's cache (legacy_router.py)
protocols/       what the model writes and is shown: XML tags, chat tool calls
families/        how each model family writes tool calls and thoughts, and which family a chat template is
tools/           what the model may call: the tool contract, the search tool with its client, the access tool
search/          search backends of their own (google.py)
training/        what slime does with finished samples: group advantages, the lag mask and staleness against the policy
                 being trained, search metrics in its logs
evaluation/      evaluate.py's body: its command lines, the run, the judge's pass, reports, papers' figures beside them
scoring/         how an answer scores: EM, F1, cover EM (Search-R1's normalisation), an LLM judge; reward and eval
viewer/          an offline HTML page of slime's dumps and evaluate.py runs (`python -m slime_search_r1.viewer`)
standin/         a scripted stand-in for SGLang anyone can serve (`python -m slime_search_r1.standin`), and SGLang's
                 answer rules it shares with the test engine
demo/            the plugin offline (`python -m slime_search_r1.demo`): the stand-in, the embedded retriever,
                 evaluate.py in both modes and the viewer's page
data.py          Search-R1's prompts, labels and test sets
http_client.py   aiohttp plumbing shared by the engine, router and search clients
"""
