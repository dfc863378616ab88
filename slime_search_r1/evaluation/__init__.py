"""evaluate.py's body: its command lines, the run, the data files, scores and reports, and published figures.

cli.py         the command lines (run, compare, rescore): every setting checked before any engine or judge call
runner.py      one evaluation: each sample through the plugin's generate() and reward_func(), one JSONL line each
dataset.py     the test file's rows as slime Samples (and K samples per question)
judging.py     the LLM judge's pass over a run: judgements.jsonl, and its verdicts joined into the reports
reports.py     every score per data source (Markdown, JSON, a bar chart) and the comparison across checkpoints
references.py  published figures (tables/*.json, or your own file) beside a run's (--reference)
"""
