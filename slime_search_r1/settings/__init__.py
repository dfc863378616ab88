"""What the user set: every setting declared once, read, checked and handed over as a read-only view.

kinds.py    what a setting accepts (Choice, Flag, Integer, ...) and ConfigError, the error a bad setting raises
table.py    the one list of settings: the plugin's (SEARCH_R1_CONFIGS and its variables) and the launch scripts'
sources.py  where each value comes from (default < SEARCH_R1_CONFIGS < environment variable), resolved to the view
view.py     the view the rollout and the launch read: plain attributes, read-only, secrets hidden in its repr
rules.py    the combinations of settings that cannot work together

It imports nothing of the plugin but registry.py (the names a setting may take), so that the launch checks the
settings without importing an implementation or slime.
"""
