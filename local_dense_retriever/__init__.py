"""Local dense retriever for Search-R1 rollouts: a batched FastAPI server, an index builder and downloads.

What a user runs is at the top; the machinery is grouped by the question each part answers:

retrieval_server.py  the server, with Search-R1's and slime's command line (a thin script: serving/cli.py)
index_builder.py     corpus jsonl -> FAISS index, Qdrant collection or BM25 index (building/index.py)
download.py          the files a retriever serves, from the Hugging Face hub (building/downloads.py)
tune_index.py        layouts measured on a Flat index, the cheapest that keeps recall named (building/tuner.py)
memory_plan.py       RAM and per-GPU memory of a layout, checked beside training (retrieval/memory_plan.py)
retrieval/   how a query becomes corpus rows: corpus access, encoders, FAISS/Qdrant/BM25 searchers, CPU threads
serving/     how the server answers: flags (config), routes (app), wire shapes (api), request bodies, loading,
             cross-request batching, connection limits, the server as a child process (launcher) and under load,
             measured from outside (server_load)
building/    how the files are made: index building (index.py names its parts), the index tuner (tuner.py names its
             parts), layouts built from a Flat index's vectors (layouts.py), hub downloads
demo/        the embedded default: the offline mini-Wikipedia, built, served and measured (`python -m
             local_dense_retriever.demo`, `make demo`)
"""
