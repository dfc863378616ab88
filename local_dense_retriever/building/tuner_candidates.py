"""The index tuner's candidate layouts: the default grid for a corpus, a spec with several values of one search
parameter expanded into its layouts (one family, built once), and the families that fit in the RAM available now."""

import sys

from local_dense_retriever.retrieval.layouts import Layout, default_nlist, default_pq, index_bytes, parse_layout
from local_dense_retriever.retrieval.memory_plan import available_ram, gib


def default_candidates(size: int, dim: int) -> list[str]:
    """HNSW with full vectors and with 8-bit codes at two M and three efSearch; IVF with Flat, SQ8 and PQ codes
    at about 4 sqrt(size) lists and three nprobe."""
    nlist, pq = default_nlist(size), default_pq(dim)
    probes = "/".join(str(p) for p in sorted({max(1, nlist // 256), max(1, nlist // 64), max(1, nlist // 16)}))
    return [
        "HNSW16:efSearch=64/128/256",
        "HNSW32:efSearch=64/128/256",
        "HNSW32,SQ8:efSearch=128/256/512",
        f"IVF{nlist},Flat:nprobe={probes}",
        f"IVF{nlist},SQ8:nprobe={probes}",
        f"IVF{nlist},PQ{pq}:nprobe={probes}",
    ]


def expand(spec: str) -> list[Layout]:
    """`HNSW32:efConstruction=200,efSearch=64/128` -> HNSW32:efConstruction=200,efSearch=64 and ...=128: one family,
    built once and searched with each value (each checked by parse_layout)."""
    factory, _, params = spec.partition(":")
    fixed, varied = [], ("", [""])
    for param in filter(None, params.split(",")):
        name, _, values = param.partition("=")
        if "/" in values:
            if varied[0]:
                raise ValueError(f"--candidates {spec!r}: one parameter may list several values (a/b/c), not two")
            varied = (name, values.split("/"))
        else:
            fixed.append(param)
    name, values = varied
    return [parse_layout(f"{factory}:" + ",".join(fixed + ([f"{name}={value}"] if name else []))) for value in values]


def check_candidates_fit(families: list[list[Layout]], size: int, dim: int, explicit: bool) -> list[list[Layout]]:
    """Drop (defaults) or refuse (the user's) candidates whose index cannot be held in the RAM available now."""
    available = available_ram()
    kept = []
    for family in families:
        needed = index_bytes(family[0].factory, size, dim) or 0
        if needed <= 0.9 * available:
            kept.append(family)
            continue
        message = f"layout {family[0].factory} needs {gib(needed)} of RAM to build and {gib(available)} is available"
        if explicit:
            raise ValueError(f"--candidates: {message}; accepted: layouts that fit (SQ8 or PQ codes, IVF)")
        print(f"skipping {message}", file=sys.stderr)
    return kept
