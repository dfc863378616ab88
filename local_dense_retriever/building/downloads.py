"""Download Search-R1's wiki-18 E5 Flat index and corpus from the Hugging Face hub, ready to serve.

    python -m local_dense_retriever.download --save_path /data/wiki18

Fetches `part_aa` + `part_ab` of PeterJinGo/wiki-18-e5-index and `wiki-18.jsonl.gz` of PeterJinGo/wiki-18-corpus
(~60-70 GB; ~130 GB once merged and decompressed), checks every size against the hub, merges the parts into
`e5_Flat.index`, decompresses the corpus and writes its offset sidecar. Rerunning resumes: partial downloads
continue (huggingface_hub), and finished steps (merged index, decompressed corpus, sidecar) are skipped.
"""

import argparse
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from local_dense_retriever.retrieval.corpus import count_documents, ensure_decompressed

logger = logging.getLogger("local_dense_retriever.download")

INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
INDEX_PARTS = ("part_aa", "part_ab")
INDEX_FILE = "e5_Flat.index"
CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
CORPUS_ARCHIVE = "wiki-18.jsonl.gz"
WIKI18_PASSAGES = 21_015_324
_COPY_BYTES = 64 << 20

FetchFn = Callable[[str, str, Path], Path]
SizesFn = Callable[[str, list[str]], dict[str, int]]


class DownloadError(RuntimeError):
    pass


def _hub_error(what: str, repo_id: str, exc: Exception) -> DownloadError:
    """One line for a hub failure, whatever class the hub library (or its HTTP client) raised."""
    from huggingface_hub import constants

    lines = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return DownloadError(f"cannot get {what} of {repo_id} from the Hugging Face hub ({constants.ENDPOINT}): {detail}")


def remote_sizes(repo_id: str, filenames: list[str]) -> dict[str, int]:
    """Sizes in bytes that the hub reports for files of a dataset repository."""
    from huggingface_hub import HfApi

    try:
        infos = HfApi().get_paths_info(repo_id, filenames, repo_type="dataset")
    except Exception as exc:  # unreachable, offline mode, not found, gated: the classes vary with the version
        raise _hub_error("the file sizes", repo_id, exc) from None
    sizes = {info.path: int(info.size) for info in infos if getattr(info, "size", None) is not None}
    missing = sorted(set(filenames) - set(sizes))
    if missing:
        raise DownloadError(f"the hub lists no {', '.join(missing)} in dataset {repo_id}")
    return sizes


def fetch(repo_id: str, filename: str, save_dir: Path) -> Path:
    """hf_hub_download into save_dir (it resumes partial files), retried on network errors."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError
    from tenacity import retry, retry_if_not_exception_type, stop_after_attempt, wait_exponential

    permanent = (EntryNotFoundError, RepositoryNotFoundError, GatedRepoError)

    @retry(
        retry=retry_if_not_exception_type(permanent),
        stop=stop_after_attempt(6),
        wait=wait_exponential(multiplier=5, max=120),
        reraise=True,
        before_sleep=lambda state: logger.warning("retrying %s after: %s", filename, state.outcome.exception()),
    )
    def download() -> Path:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset", local_dir=save_dir))

    try:
        return download()
    except Exception as exc:  # after the retries above, or at once for a permanent error
        raise _hub_error(filename, repo_id, exc) from None


def check_size(path: Path, expected: int) -> None:
    actual = path.stat().st_size
    if actual != expected:
        raise DownloadError(f"{path} has {actual} bytes but the hub says {expected}; delete it and run again")


def ensure_writable_directory(directory: Path) -> None:
    """Create `directory` and prove a file can be written in it, before hours of download depend on it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise DownloadError(f"cannot write to {directory}: {exc.strerror or exc}") from None


def ensure_free_space(directory: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise DownloadError(f"{what} needs {needed / 1e9:.1f} GB in {directory}, only {free / 1e9:.1f} GB are free")


def merge_parts(parts: list[Path], out: Path, progress: bool = True) -> Path:
    """Concatenate split files (like `cat part_* > out`), via a temporary file so a crash leaves no bad output."""
    total = sum(part.stat().st_size for part in parts)
    if out.exists() and out.stat().st_size == total:
        return out
    ensure_free_space(out.parent, total, f"merging into {out.name}")
    partial = out.with_name(out.name + ".partial")
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"merge {out.name}", disable=not progress)
    with bar, open(partial, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(_COPY_BYTES):
                    dst.write(block)
                    bar.update(len(block))
    check_size(partial, total)
    os.replace(partial, out)
    return out


def download_index(save_dir: Path, fetch_fn: FetchFn, sizes_fn: SizesFn, keep_parts: bool, progress: bool) -> Path:
    sizes = sizes_fn(INDEX_REPO, list(INDEX_PARTS))
    index_path = save_dir / INDEX_FILE
    if index_path.exists() and index_path.stat().st_size == sum(sizes.values()):
        logger.info("%s is already complete", index_path)
        return index_path
    parts = []
    for name in INDEX_PARTS:
        part = fetch_fn(INDEX_REPO, name, save_dir)
        check_size(part, sizes[name])
        parts.append(part)
    merge_parts(parts, index_path, progress=progress)  # checks the merged size before it takes the final name
    if not keep_parts:
        for part in parts:
            part.unlink()
    return index_path


def download_corpus(save_dir: Path, fetch_fn: FetchFn, sizes_fn: SizesFn, keep_parts: bool, progress: bool) -> Path:
    corpus_path = save_dir / CORPUS_ARCHIVE.removesuffix(".gz")
    archive = save_dir / CORPUS_ARCHIVE
    if not (corpus_path.exists() and not archive.exists()):  # done when only the decompressed corpus is left
        sizes = sizes_fn(CORPUS_REPO, [CORPUS_ARCHIVE])
        archive = fetch_fn(CORPUS_REPO, CORPUS_ARCHIVE, save_dir)
        check_size(archive, sizes[CORPUS_ARCHIVE])
        if not corpus_path.exists():
            ensure_free_space(save_dir, 3 * archive.stat().st_size, f"decompressing {archive.name}")
        corpus_path = ensure_decompressed(archive, progress=progress)
    documents = count_documents(corpus_path, progress=progress)  # writes the offset sidecar once
    if not keep_parts and archive.exists():
        archive.unlink()
    if documents != WIKI18_PASSAGES:
        logger.warning("%s has %d passages; wiki-18 has %d", corpus_path, documents, WIKI18_PASSAGES)
    logger.info("%s: %d passages", corpus_path, documents)
    return corpus_path


def download_wiki18(
    save_dir: Path,
    index: bool = True,
    corpus: bool = True,
    keep_parts: bool = False,
    fetch_fn: FetchFn = fetch,
    sizes_fn: SizesFn = remote_sizes,
    progress: bool = True,
) -> dict[str, Path]:
    ensure_writable_directory(save_dir)
    outputs = {}
    if index:
        outputs["index_path"] = download_index(save_dir, fetch_fn, sizes_fn, keep_parts, progress)
    if corpus:
        outputs["corpus_path"] = download_corpus(save_dir, fetch_fn, sizes_fn, keep_parts, progress)
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save_path", required=True, type=Path, help="directory for e5_Flat.index and wiki-18.jsonl")
    parser.add_argument("--skip_index", action="store_true", help="only the corpus")
    parser.add_argument("--skip_corpus", action="store_true", help="only the index")
    parser.add_argument("--keep_parts", action="store_true", help="keep part_aa/part_ab and the .gz after use")
    args = parser.parse_args(argv)
    if args.skip_index and args.skip_corpus:
        parser.error("--skip_index and --skip_corpus together leave nothing to do")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        outputs = download_wiki18(
            args.save_path, index=not args.skip_index, corpus=not args.skip_corpus, keep_parts=args.keep_parts
        )
    except (DownloadError, OSError) as err:  # OSError: the disk or the directory failed mid-way
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name, path in outputs.items():
        print(f"--{name} {path}")
    return 0
