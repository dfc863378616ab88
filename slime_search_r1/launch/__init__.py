"""The launch side: what run_qwen2.5_3B.sh and run_qwen2.5_3B_with_retrieval.sh hand over to Python. Their settings
are rows of settings/table.py, beside the plugin's (`python -m slime_search_r1.launch --list` prints them all).

__main__.py          python -m slime_search_r1.launch, the one call run_qwen2.5_3B.sh makes (and --list)
checks.py            the checks generate() makes at its first sample, made on train.py's flags before Ray starts
command.py           one launch decided: every value and its source, the flags they imply, the runtime env
printed.py           what a dry run prints: the values' sources, the commands, the viewer and checkpoint commands
ray_job.py           a real run: a Ray head only when none answers, the job, and stopping only what it started
signals.py           Ctrl-C, SIGTERM and SIGHUP stop a run with the shell's exit code; the cleanup is not cut short
retriever_memory.py  a retrieval server's memory plan beside what train.py's flags hold on each GPU
with_retrieval.py    python -m slime_search_r1.launch.with_retrieval: the retriever and training side by side in tmux
retriever_server.py  the server it starts: its flags, CPUs and memory plan, checked first, and its readiness
tmux_session.py      its tmux session: the windows, the training window's program, stopping training
"""
