"""What an index file holds, read without loading it: its dimension and size from the header, and the vectors of a
Flat index (or a saved .npy) as a read-only memory-mapped array, so a 61 GB wiki-18 index is never copied whole.
"""

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Every FAISS index file starts with a four-character type code, then the dimension (int32) and the number of
# vectors (int64) (faiss/impl/index_write.cpp, write_index_header); wrappers (IDMap, PreTransform) are not headed so.
FLAT_CODES = {b"IxFI": "ip", b"IxF2": "l2"}
MAX_DIM = 1 << 16


@dataclass(frozen=True)
class IndexHeader:
    code: str
    dim: int
    size: int

    @property
    def is_flat(self) -> bool:
        return self.code.encode() in FLAT_CODES


def read_header(path: str | Path) -> IndexHeader | None:
    """The type code, dimension and size of a FAISS index file, from its first 16 bytes (None: not headed so)."""
    with open(path, "rb") as f:
        head = f.read(16)
    # FAISS's type codes start with "I" (IxFI, IHNf, IwPQ, ...); anything else is left to FAISS's own reader, whose
    # error names the problem better than a dimension read from arbitrary bytes would.
    if len(head) < 16 or not head[:4].isalnum() or head[:1] != b"I":
        return None
    dim, size = struct.unpack("<iq", head[4:16])
    if not 0 < dim <= MAX_DIM or size < 0:
        return None
    return IndexHeader(head[:4].decode("ascii"), dim, size)


def check_dimension(index_path: str | Path, encoder_dim: int) -> None:
    """Refuse an index of another dimension than the encoder's before the index is read (minutes at wiki-18)."""
    header = read_header(index_path)
    if header is not None and header.dim != encoder_dim:
        raise ValueError(
            f"--index_path {index_path}: the index holds {header.dim}-d vectors but the encoder (--retriever_model) "
            f"produces {encoder_dim}-d ones; accepted: an index built with the same encoder"
        )


class FlatVectors:
    """The vectors of a Flat index file or a float32 .npy, memory-mapped and read-only: `array` is (size, dim).

    Pages are read from disk as rows are touched and stay in the page cache only while memory allows, so
    streaming over them in chunks costs no extra full copy in RAM.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.suffix == ".npy":
            try:
                array = np.load(self.path, mmap_mode="r")
            except (OSError, ValueError) as err:
                raise ValueError(f"{self.path}: not a readable .npy file ({err})") from None
            if array.ndim != 2 or array.dtype != np.float32:
                raise ValueError(f"{self.path}: accepted is a 2-d float32 array; got {array.dtype} {array.shape}")
            self.metric, self._index = "ip", None
        else:
            header = read_header(self.path)
            if header is None or not header.is_flat:
                kind = header.code if header else "not a FAISS index"
                raise ValueError(f"{self.path}: accepted is a Flat FAISS index (IndexFlatIP/L2) or a .npy; got {kind}")
            import faiss

            self._index = faiss.read_index(str(self.path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
            self.metric = FLAT_CODES[header.code.encode()]
            size, dim = int(self._index.ntotal), int(self._index.d)
            array = faiss.rev_swig_ptr(self._index.get_xb(), size * dim).reshape(size, dim) if size else None
            array = np.empty((0, dim), np.float32) if array is None else array
            array.flags.writeable = False  # the mapping is read-only: a write would crash the process
        self.array = array
        self.size, self.dim = int(array.shape[0]), int(array.shape[1])

    def chunks(self, rows: int, start: int = 0, stop: int | None = None):
        """(first row, float32 contiguous copy of up to `rows` rows) over [start, stop)."""
        stop = self.size if stop is None else stop
        for first in range(start, stop, rows):
            yield first, np.array(self.array[first : min(stop, first + rows)], dtype=np.float32)  # a writable copy

    def sample(self, count: int, seed: int = 0) -> np.ndarray:
        """`count` distinct rows drawn at random (sorted, so the reads go forward through the file)."""
        if count >= self.size:
            return np.array(self.array, dtype=np.float32)
        rows = np.sort(np.random.default_rng(seed).choice(self.size, count, replace=False))
        return np.array(self.array[rows], dtype=np.float32)
