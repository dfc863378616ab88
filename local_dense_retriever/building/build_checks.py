"""What the builder checks before the hours of encoding (wiki-18: ~21M passages): every output location can be
written, the disk holds the vectors written through a memory map, and every corpus line parses."""

import os
import shutil
from pathlib import Path

from tqdm import tqdm

from local_dense_retriever.building.index_config import BuildConfig
from local_dense_retriever.retrieval.corpus import iter_documents, offsets_path_for


def output_locations(config: BuildConfig) -> list[tuple[str, Path, str]]:
    """(what, path, "file" | "directory") for everything the build writes."""
    corpus = Path(config.corpus_path)
    decompressed = corpus.with_suffix("") if corpus.suffix == ".gz" else corpus
    outputs = [("the corpus's offset sidecar", offsets_path_for(decompressed), "file")]
    if corpus.suffix == ".gz":
        outputs.append(("the decompressed corpus", decompressed, "file"))
    if config.is_bm25:
        outputs.append(("the BM25 index (--index_path / --save_dir)", Path(config.index_path), "directory"))
        return outputs
    if config.backend == "qdrant":
        if config.qdrant_path:
            outputs.append(("the Qdrant storage (--qdrant_path)", Path(config.qdrant_path), "directory"))
    else:
        outputs.append(("the index (--index_path / --save_dir)", Path(config.index_path), "file"))
    if config.save_embeddings:
        outputs.append(("the embeddings (--save_embeddings)", Path(config.save_embeddings), "file"))
    return outputs


def check_output_locations(config: BuildConfig) -> None:
    """Create and write-test every output location now, not after hours of encoding."""
    for what, path, kind in output_locations(config):
        directory = path if kind == "directory" else path.parent
        if kind == "file" and path.is_dir():
            raise ValueError(f"{what}: {path} is a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".{path.name}.write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            reason = f"{err.strerror or err}: {err.filename or directory}"
            raise ValueError(f"{what}: cannot write {path} ({reason})") from None


def check_free_space(config: BuildConfig, total: int, dim: int) -> None:
    """Vectors are written through a memory map: a full disk there kills the process (SIGBUS), so check first."""
    needed: dict[int, tuple[int, Path]] = {}
    files = [Path(config.save_embeddings)] if config.save_embeddings else []
    if config.backend == "faiss" and config.faiss_type == "Flat":  # BM25 builds never get here
        files.append(Path(config.index_path))  # a Flat index holds every vector too; others are smaller
    for path in files:
        device = path.parent.stat().st_dev
        size, _ = needed.get(device, (0, path))
        needed[device] = (size + total * dim * 4, path)
    for size, path in needed.values():
        free = shutil.disk_usage(path.parent).free
        if free < size:
            raise ValueError(
                f"{path.parent} has {free / 2**30:.1f} GiB free but {total} {dim}-d float32 vectors need "
                f"{size / 2**30:.1f} GiB there"
            )


def validate_corpus(corpus_path: Path, total: int, progress: bool) -> None:
    """Parse every line before encoding any: a bad line at row 20M must not cost the hours before it."""
    with tqdm(total=total, unit="doc", desc="check corpus", disable=not progress) as bar:
        for count, _ in enumerate(iter_documents(corpus_path), start=1):
            if count % 65536 == 0:
                bar.update(65536)
        bar.update(total - bar.n)
