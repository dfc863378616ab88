"""evaluate.py's body: its command lines, the run, the judge's pass, the reports, and published figures.

cli.py         the commands (a run, compare, rescore): main() and each command's steps in order
arguments.py   their command lines: every setting checked before any engine or judge call
dataset.py     the test file's rows as slime Samples (and K samples per question)
runner.py      one evaluation: each sample through the plugin's generate() and reward_func(), one JSONL line each
store.py       the output folder: trajectories.jsonl (append-only, resumable) and run_config.json
judging.py     the LLM judge's pass over a run: judgements.jsonl, and its verdicts joined into the reports
summary.py     every score per data source, avg@k and pass@k, and their mean over the data sources
reports.py     results.md and results.json, printed at the end of a run
chart.py       em_by_source.png, the scores as bars (matplotlib)
comparison.py  `evaluate.py compare`: several runs' scores per data source as tables and line charts
references.py  published figures (tables/*.json, or your own file) beside a run's (--reference)

The viewer reads the folders a run writes (store.py names their files); nothing here imports it.
"""
