"""Corpus access without loading the corpus: a jsonl file, memory-mapped, plus a byte-offset sidecar.

Each line is one passage, `{"id": "0", "contents": "\"Title\"\ntext ..."}`; line i is FAISS row i. The sidecar
`<corpus>.offsets.npy` holds the start offset of every line (and two trailing stamps, see `build_offsets`). It is
built once with numpy (about a second per GB) and memory-mapped afterwards, so a 21M-passage corpus opens in
milliseconds and `corpus[i]` costs one slice and one JSON parse. JsonLines is that access for any jsonl file of
objects (the pages file uses it too, pages.py); Corpus adds the passage format.
"""

import gzip
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import orjson
from tqdm import tqdm

OFFSETS_SUFFIX = ".offsets.npy"
_BLOCK_BYTES = 64 << 20


class CorpusFormatError(ValueError):
    """A line that is not a JSON object of the file's format; the message names file and line."""


def offsets_path_for(corpus_path: Path) -> Path:
    return corpus_path.with_name(corpus_path.name + OFFSETS_SUFFIX)


def ensure_decompressed(path: Path, progress: bool = True) -> Path:
    """`x.jsonl.gz` -> `x.jsonl` beside it, decompressed once and reused while newer than the archive."""
    if path.suffix != ".gz":
        return path
    target = path.with_suffix("")
    if target.exists() and target.stat().st_mtime >= path.stat().st_mtime:
        return target
    partial = target.with_name(target.name + ".partial")
    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc=f"gunzip {path.name}", disable=not progress)
    with bar, open(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as src, open(partial, "wb") as dst:
        while block := src.read(_BLOCK_BYTES):
            dst.write(block)
            bar.update(raw.tell() - bar.n)
    # The rename makes an interrupted run start over instead of serving a truncated corpus.
    os.replace(partial, target)
    return target


def build_offsets(corpus_path: Path, progress: bool = True) -> np.ndarray:
    """uint64 array: start offset of each line, the end of the last line, then the file size it was built from.

    Trailing whitespace-only lines are not counted, so an editor's extra newline does not shift row numbers.
    """
    size = corpus_path.stat().st_size
    starts = [np.zeros(1, dtype=np.uint64)]
    bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"index lines of {corpus_path.name}", disable=not progress)
    with bar, open(corpus_path, "rb") as f:
        position = 0
        while block := f.read(_BLOCK_BYTES):
            newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            starts.append((newlines + position + 1).astype(np.uint64))
            position += len(block)
            bar.update(len(block))
    bounds = np.concatenate(starts)
    if bounds[-1] != size:  # last line has no newline
        bounds = np.append(bounds, np.uint64(size))
    with open(corpus_path, "rb") as f:
        while len(bounds) > 1:
            f.seek(int(bounds[-2]))
            if f.read(int(bounds[-1] - bounds[-2])).strip():
                break
            bounds = bounds[:-1]
    return np.append(bounds, np.uint64(size))


def load_offsets(corpus_path: Path, progress: bool = True) -> np.ndarray:
    """The sidecar, memory-mapped; (re)built when missing or older than the corpus. Returns line bounds (n+1)."""
    sidecar = offsets_path_for(corpus_path)
    stat = corpus_path.stat()
    if sidecar.exists() and sidecar.stat().st_mtime >= stat.st_mtime:
        stamped = np.load(sidecar, mmap_mode="r")
        if len(stamped) >= 2 and int(stamped[-1]) == stat.st_size:
            return stamped[:-1]
    stamped = build_offsets(corpus_path, progress=progress)
    partial = sidecar.with_name(sidecar.name + ".partial.npy")
    np.save(partial, stamped)
    os.replace(partial, sidecar)
    return np.load(sidecar, mmap_mode="r")[:-1]


def count_documents(corpus_path: Path, progress: bool = True) -> int:
    return len(load_offsets(corpus_path, progress=progress)) - 1


def parse_object(
    line: bytes, path: Path, line_number: int, expected: str = "a JSON object", string_field: str | None = None
) -> dict:
    """The JSON object on a line (with a string `string_field`, when named); CorpusFormatError names the file, the
    line and `expected`."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise CorpusFormatError(f"{path}:{line_number}: not valid JSON ({err})") from None
    if not isinstance(record, dict) or (string_field is not None and not isinstance(record.get(string_field), str)):
        raise CorpusFormatError(f"{path}:{line_number}: expected {expected}, got {line[:120]!r}")
    return record


_PASSAGE = 'a JSON object with a string "contents" field, like {"id": "0", "contents": "\\"Title\\"\\ntext"}'


def parse_document(line: bytes, path: Path, line_number: int) -> dict:
    return parse_object(line, path, line_number, _PASSAGE, "contents")


class JsonLines:
    """Random access to the records of a jsonl (or .jsonl.gz) file by row number; `parse` reads one line."""

    what = "records"  # for messages: "the pages file has no records"
    parse = staticmethod(parse_object)

    def __init__(self, path: str | os.PathLike, progress: bool = True):
        self.path = ensure_decompressed(Path(path), progress=progress)
        # A plain view of the mapped offsets: numpy.memmap's subclass hooks cost ~40 us per lookup, a third of the
        # server's event-loop time per request (cProfile, 500 requests/s).
        self._bounds = load_offsets(self.path, progress=progress).view(np.ndarray)
        if len(self) == 0:
            raise CorpusFormatError(f"{self.path}: the file has no {self.what}")
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self[0]  # fail at startup, not on the first request, when the format is wrong

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def line(self, row: int) -> bytes:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} is outside the corpus {self.path} ({len(self)} documents)")
        return self._map[int(self._bounds[row]) : int(self._bounds[row + 1])]

    def __getitem__(self, row: int) -> dict:
        return self.parse(self.line(row), self.path, row + 1)

    def get_many(self, rows: Sequence[int]) -> list[dict]:
        return [self[row] for row in rows]

    @property
    def mean_line_bytes(self) -> float:
        return float(self._bounds[-1] - self._bounds[0]) / len(self)

    def lines_bytes(self, rows: Sequence[int]) -> int:
        """Total size of these lines in bytes, from the offsets alone (no parsing): responses are sized with it."""
        rows = np.asarray(rows, dtype=np.int64)
        return int((self._bounds[rows + 1] - self._bounds[rows]).sum()) if len(rows) else 0

    def close(self) -> None:
        self._map.close()
        self._file.close()


class Corpus(JsonLines):
    """The passages of a corpus by row number (row i is index row i)."""

    what = "documents"
    parse = staticmethod(parse_document)


def iter_documents(path: Path, parse=parse_document) -> Iterator[dict]:
    """Stream and validate every record in order (the index builder's reader); errors name file and line."""
    with open(path, "rb") as f:
        for line_number, line in enumerate(f, start=1):
            if line.strip():
                yield parse(line, path, line_number)
            else:
                pending_blank = line_number
                # A blank line is only allowed at the end of the file (see build_offsets).
                for rest_number, rest in enumerate(f, start=line_number + 1):
                    if rest.strip():
                        raise CorpusFormatError(f"{path}:{pending_blank}: blank line before line {rest_number}")
                return
