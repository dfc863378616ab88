"""Download what a retriever serves from the Hugging Face hub, ready to serve. Two sets:

    python -m local_dense_retriever.download --save_path /data/wiki18                      # Search-R1's (default)
    python -m local_dense_retriever.download --save_path /data/asearcher --files asearcher  # ASearcher's, as RLinf

wiki18: `part_aa` + `part_ab` of PeterJinGo/wiki-18-e5-index and `wiki-18.jsonl.gz` of PeterJinGo/wiki-18-corpus
(~60-70 GB; ~130 GB once merged and decompressed): every size is checked against the hub, the parts are merged into
`e5_Flat.index`, the corpus is decompressed and its offset sidecar written.
asearcher: `wiki_corpus.jsonl` and `wiki_webpages.jsonl` of inclusionAI/ASearcher-Local-Knowledge (~50 GB) and the
intfloat/e5-base-v2 encoder, in the layout of RLinf's Search-R1 guide; the corpus's offsets and the pages' URL index
are written once, and the command that builds `e5.index/e5_Flat.index` from the corpus is printed.
Rerunning resumes: partial downloads continue (huggingface_hub), and finished steps are skipped.
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
ASEARCHER_REPO = "inclusionAI/ASearcher-Local-Knowledge"
ASEARCHER_CORPUS = "wiki_corpus.jsonl"
ASEARCHER_PAGES = "wiki_webpages.jsonl"
E5_MODEL = "intfloat/e5-base-v2"
ASEARCHER_INDEX = Path("e5.index") / "e5_Flat.index"  # where RLinf's guide builds it (--save_dir e5.index)
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


def fetch_model(repo_id: str, save_dir: Path) -> Path:
    """snapshot_download of a model into save_dir/<name> (resumable), retried like fetch()."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    from tenacity import retry, retry_if_not_exception_type, stop_after_attempt, wait_exponential

    @retry(
        retry=retry_if_not_exception_type((RepositoryNotFoundError, GatedRepoError)),
        stop=stop_after_attempt(6),
        wait=wait_exponential(multiplier=5, max=120),
        reraise=True,
        before_sleep=lambda state: logger.warning("retrying %s after: %s", repo_id, state.outcome.exception()),
    )
    def download() -> Path:
        return Path(snapshot_download(repo_id=repo_id, local_dir=save_dir / repo_id.rsplit("/", 1)[-1]))

    try:
        return download()
    except Exception as exc:
        raise _hub_error("the model", repo_id, exc) from None


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


def download_asearcher(
    save_dir: Path,
    model: bool = True,
    fetch_fn: FetchFn = fetch,
    sizes_fn: SizesFn = remote_sizes,
    model_fn: Callable[[str, Path], Path] = fetch_model,
    progress: bool = True,
) -> dict[str, Path]:
    """ASearcher-Local-Knowledge's corpus and pages (and e5-base-v2) in RLinf's layout, their sidecars written."""
    from local_dense_retriever.retrieval.pages import Pages

    ensure_writable_directory(save_dir)
    names = [ASEARCHER_CORPUS, ASEARCHER_PAGES]
    sizes = sizes_fn(ASEARCHER_REPO, names)
    missing = sum(sizes[name] for name in names if not _complete(save_dir / name, sizes[name]))
    if missing:
        ensure_free_space(save_dir, missing, f"{ASEARCHER_REPO}'s files")
    paths = {}
    for name in names:
        path = save_dir / name
        if not _complete(path, sizes[name]):
            path = fetch_fn(ASEARCHER_REPO, name, save_dir)
            check_size(path, sizes[name])
        paths[name] = path
    outputs = {"corpus_path": paths[ASEARCHER_CORPUS], "pages_path": paths[ASEARCHER_PAGES]}
    logger.info("%s: %d passages", outputs["corpus_path"], count_documents(outputs["corpus_path"], progress=progress))
    pages = Pages(outputs["pages_path"], progress=progress)  # its offsets and URL index, once, now
    logger.info("%s: %d pages", outputs["pages_path"], len(pages))
    pages.close()
    if model:
        outputs["retriever_model"] = model_fn(E5_MODEL, save_dir)
    outputs["index_path"] = save_dir / ASEARCHER_INDEX  # built by the index builder (printed by main)
    return outputs


def _complete(path: Path, size: int) -> bool:
    return path.exists() and path.stat().st_size == size


def asearcher_next_steps(outputs: dict[str, Path]) -> str:
    """The commands that build the index RLinf's layout expects and serve it (RLinf's own flags)."""
    model = outputs.get("retriever_model", E5_MODEL)
    index = outputs["index_path"]
    return (
        "build the E5 index (GPUs: fp16, every GPU; hours for the whole corpus):\n"
        f"  python -m local_dense_retriever.index_builder --retriever_name e5 --retriever_model {model} "
        f"--corpus_path {outputs['corpus_path']} --save_dir {index.parent} --faiss_type Flat --max_length 256\n"
        "then serve it with RLinf's command line (--faiss_gpu needs faiss-gpu and a GPU):\n"
        f"  python local_dense_retriever/retrieval_server.py --index_path {index} "
        f"--corpus_path {outputs['corpus_path']} --pages_path {outputs['pages_path']} --topk 3 --retriever_name e5 "
        f"--retriever_model {model} --faiss_gpu --port 8000"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save_path", required=True, type=Path, help="directory for the files")
    parser.add_argument(
        "--files",
        choices=["wiki18", "asearcher"],
        default="wiki18",
        help="wiki18: Search-R1's E5 index and corpus; asearcher: ASearcher's corpus, pages and e5-base-v2",
    )
    parser.add_argument("--skip_model", action="store_true", help="asearcher: not the e5-base-v2 encoder")
    parser.add_argument("--skip_index", action="store_true", help="only the corpus")
    parser.add_argument("--skip_corpus", action="store_true", help="only the index")
    parser.add_argument("--keep_parts", action="store_true", help="keep part_aa/part_ab and the .gz after use")
    args = parser.parse_args(argv)
    if args.files == "asearcher" and (args.skip_index or args.skip_corpus or args.keep_parts):
        parser.error("--skip_index, --skip_corpus and --keep_parts are for --files wiki18")
    if args.skip_index and args.skip_corpus:
        parser.error("--skip_index and --skip_corpus together leave nothing to do")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.files == "asearcher":
            outputs = download_asearcher(args.save_path, model=not args.skip_model)
        else:
            outputs = download_wiki18(
                args.save_path, index=not args.skip_index, corpus=not args.skip_corpus, keep_parts=args.keep_parts
            )
    except (DownloadError, ValueError, OSError) as err:  # OSError: the disk or the directory failed mid-way
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name, path in outputs.items():
        print(f"--{name} {path}")
    if args.files == "asearcher":
        print(asearcher_next_steps(outputs))
    return 0
