"""The offline rollout demo (`python -m slime_search_r1.demo`, `make rollout-demo`): rollouts.py runs it, scripts.py
holds what its scripted policy writes, families.py runs a few episodes on each model family."""
