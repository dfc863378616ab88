"""Local dense retriever for Search-R1 rollouts: a batched FastAPI server, an index builder and downloads.

Modules, one job each:
- `corpus`: jsonl corpus access through a memory-mapped byte-offset sidecar (O(1) lookup, no full load).
- `encoders`: E5 / BGE / DPR / any Hugging Face encoder, pooling, device and dtype choice.
- `backends`: FAISS, BM25 (bm25s) and Qdrant searchers behind one interface.
- `batcher`: dynamic cross-request batching on a single worker thread.
- `retrieval_server`: the FastAPI app and its CLI (Search-R1's flags and API).
- `connections`: uvicorn's HTTP protocol with a request-header deadline and a cap on open connections.
- `model_source`: `--retriever_model` checked as a local directory or a Hugging Face hub id before loading.
- `index_builder`: corpus jsonl -> FAISS index / Qdrant collection / BM25 index.
- `download`: the wiki-18 E5 index and corpus from the Hugging Face hub.
- `mini_wiki`, `embedded_default`: the offline mini-Wikipedia default and its evaluation.
- `launcher`: the server CLI as a child process on loopback (demo, benchmark, CLI tests).
"""
