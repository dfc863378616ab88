"""The launch side: what run_qwen2.5_3B.sh and run_qwen2.5_3B_with_retrieval.sh hand over to Python.

knobs.py           the scripts' own variables, each declared once (the plugin's settings stay in settings.py)
checks.py          the checks generate() makes at its first sample, made on train.py's flags before Ray starts
command.py         one launch decided: every value and its source, the flags they imply, the runtime env
printed.py         what a dry run prints: the values' sources, the commands, the viewer and checkpoint commands
ray_job.py         a real run: a Ray head only when none answers, the job, and stopping only what it started
signals.py         Ctrl-C, SIGTERM and SIGHUP stop a run with the shell's exit code; the cleanup is not cut short
__main__.py        python -m slime_search_r1.launch, the one call run_qwen2.5_3B.sh makes
with_retrieval.py  python -m slime_search_r1.launch.with_retrieval: the retriever and training side by side in tmux
"""
