"""The layout of a FAISS index file, named as the memory plan and the tuner name layouts (HNSW32, HNSW32,SQ8,
IVF4096,Flat, IVF4096,PQ48, ...), read from the file's own fields without loading it: a 60 GB graph costs a few
reads and seeks here, where faiss.read_index would read all of it.

The fields follow FAISS's writer (faiss/impl/index_write.cpp): every index opens with a four-character type code
and write_index_header's fields; an HNSW index then writes its graph (write_HNSW: five vectors and five int32s)
before its storage index; an IVF index writes nlist and nprobe, its coarse quantizer (a Flat index), its direct
map, then its codes' quantizer (write_ScalarQuantizer or write_ProductQuantizer).
"""

import struct
from pathlib import Path
from typing import BinaryIO

HNSW_CODES = {b"IHNf": "", b"IHNs": "SQ", b"IHNp": "PQ"}  # what follows the graph: Flat, SQ or PQ storage
IVF_CODES = {b"IwFl": "Flat", b"IwSq": "SQ", b"IwPQ": "PQ"}
FLAT_CODES = (b"IxFI", b"IxF2")
# ScalarQuantizer::QuantizerType (faiss/impl/ScalarQuantizer.h) as index_factory spells it
SQ_NAMES = {0: "SQ8", 1: "SQ4", 2: "SQ8", 3: "SQ4", 4: "SQfp16", 6: "SQ6", 7: "SQbf16"}


class _Reader:
    def __init__(self, file: BinaryIO):
        self.file = file

    def read(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        data = self.file.read(size)
        if len(data) != size:
            raise ValueError("the file ends inside the index")
        values = struct.unpack("<" + fmt, data)
        return values[0] if len(values) == 1 else values

    def skip_vector(self, item_bytes: int) -> None:
        """A FAISS vector: its length (size_t), then its items."""
        self.file.seek(self.read("Q") * item_bytes, 1)

    def header(self) -> tuple[bytes, int]:
        """write_index_header after the type code: d, ntotal, two dummies, is_trained, metric (and its argument)."""
        code = self.file.read(4)
        dim, _, _, _, _, metric = self.read("iqqq?i")
        if metric > 1:
            self.read("f")
        return code, dim

    def codes(self, kind: str) -> str:
        """The codes' name: SQ8, SQfp16, ... (write_ScalarQuantizer: qtype first) or PQ48, PQ48x4 (d, M, nbits)."""
        if kind == "SQ":
            return SQ_NAMES.get(self.read("i"), "SQ")
        _, m, nbits = self.read("QQQ")
        return f"PQ{m}" + ("" if nbits == 8 else f"x{nbits}")


def layout_name(path: str | Path) -> str | None:
    """The layout the index at `path` holds, as the memory plan names it; None for a file or type it does not cover
    (the caller then says what the file is)."""
    try:
        with open(path, "rb") as file:
            return _layout(_Reader(file))
    except (OSError, ValueError, struct.error):
        return None


def _layout(reader: _Reader) -> str | None:
    code, _ = reader.header()
    if code in FLAT_CODES:
        return "Flat"
    if code in HNSW_CODES:
        reader.skip_vector(8)  # assign_probas (double)
        levels = [reader.read("i") for _ in range(reader.read("Q"))]  # cum_nneighbor_per_level: 0, 2M, 3M, ...
        if len(levels) < 2:
            return None
        name = f"HNSW{levels[1] // 2}"
        if not HNSW_CODES[code]:
            return name
        for item_bytes in (4, 8, 4):  # levels (int32), offsets (size_t), neighbors (int32)
            reader.skip_vector(item_bytes)
        reader.read("iiiii")  # entry_point, max_level, efConstruction, efSearch, a dummy
        storage, _ = reader.header()
        if storage not in (b"IxSQ", b"IxPq"):
            return None
        return f"{name},{reader.codes(HNSW_CODES[code])}"
    if code in IVF_CODES:
        nlist, _ = reader.read("QQ")
        quantizer, _ = reader.header()
        if quantizer not in FLAT_CODES:
            return None
        reader.skip_vector(4)  # the centroids (float)
        kind = IVF_CODES[code]
        if kind == "Flat":
            return f"IVF{nlist},Flat"
        if reader.read("B") == 2:  # direct map type: a hashtable (of idx_t pairs) after its array
            reader.skip_vector(8)
            reader.skip_vector(16)
        else:
            reader.skip_vector(8)
        if kind == "PQ":
            reader.read("?Q")  # by_residual, code_size
        return f"IVF{nlist},{reader.codes(kind)}"
    return None
