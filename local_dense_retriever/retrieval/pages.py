"""Pages by URL, as ASearcher serves them (POST /access): a jsonl file of page records that each hold a `url`, tens
of GB in the real set (wiki_webpages.jsonl), read like the corpus through its offset sidecar and a URL index beside
it, both memory-mapped: nothing is loaded into a Python dict.

`<pages>.urls.npy` holds, sorted, a 64-bit hash of every page's URL and the page's row. A lookup hashes the URL,
finds its rows by binary search and compares the URLs themselves, so a hash collision costs one more read, never a
wrong page. The index is built in one pass over the file and rebuilt when the file changes, like the offsets.
"""

import hashlib
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.retrieval.corpus import JsonLines, parse_object

URL_INDEX_SUFFIX = ".urls.npy"
URL_INDEX_DTYPE = np.dtype([("hash", "<u8"), ("row", "<u8")])
_STAMP_ROW = np.iinfo(np.uint64).max  # the last entry stamps the file size the index was built from


def asearcher_url(url: str) -> str:
    """ASearcher's one rewrite before a lookup: `index.php/` becomes `index.php?title=`."""
    return url.replace("index.php/", "index.php?title=")


def url_hash(url: str) -> int:
    return int.from_bytes(hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


_PAGE = 'a page: a JSON object with a string "url" (and its "contents")'


def parse_page(line: bytes, path: Path, line_number: int) -> dict:
    return parse_object(line, path, line_number, _PAGE, "url")


def url_index_path_for(pages_path: Path) -> Path:
    return pages_path.with_name(pages_path.name + URL_INDEX_SUFFIX)


class Pages(JsonLines):
    """The pages of a pages file, found by URL exactly as ASearcher finds them."""

    what = "pages"
    parse = staticmethod(parse_page)

    def __init__(self, path: str | os.PathLike, progress: bool = True):
        super().__init__(path, progress=progress)
        self._index = self._load_url_index(progress)

    def _load_url_index(self, progress: bool) -> np.ndarray:
        sidecar = url_index_path_for(self.path)
        stat = self.path.stat()
        if sidecar.exists() and sidecar.stat().st_mtime >= stat.st_mtime:
            stamped = np.load(sidecar, mmap_mode="r")
            stamp = stamped[-1] if len(stamped) == len(self) + 1 else None
            if stamp is not None and stamp["row"] == _STAMP_ROW and stamp["hash"] == stat.st_size:
                return stamped[:-1]
        entries = np.empty(len(self) + 1, dtype=URL_INDEX_DTYPE)
        for row in tqdm(range(len(self)), unit="page", desc=f"index URLs of {self.path.name}", disable=not progress):
            entries[row] = (url_hash(self[row]["url"]), row)
        entries[-1] = (stat.st_size, _STAMP_ROW)
        # by hash, rows ascending within a hash: a duplicated URL's last line is its last candidate
        order = np.argsort(entries[:-1]["hash"], kind="stable")
        entries[:-1] = entries[:-1][order]
        partial = sidecar.with_name(sidecar.name + ".partial.npy")
        np.save(partial, entries)
        os.replace(partial, sidecar)
        return np.load(sidecar, mmap_mode="r")[:-1]

    def rows_of(self, url: str) -> list[int]:
        """Rows whose URL may be `url` (same hash), in file order."""
        hashes = self._index["hash"]
        key = np.uint64(url_hash(url))
        start, end = np.searchsorted(hashes, key, "left"), np.searchsorted(hashes, key, "right")
        return [int(row) for row in self._index["row"][start:end]]

    def candidates(self, url: str) -> list[int]:
        """Rows that may hold the page at `url` after ASearcher's rewrite, the likeliest first: a URL on several lines
        is found on its last one, as in ASearcher's dict."""
        return list(reversed(self.rows_of(asearcher_url(url))))

    def page_at(self, row: int, url: str) -> dict | None:
        """The page on `row` if it is the one at `url` (after the rewrite): a hash collision is no match."""
        page = self[row]
        return page if page["url"] == asearcher_url(url) else None

    def find(self, url: str) -> dict | None:
        """The page at `url`, exactly as ASearcher finds it, or None."""
        return next((page for row in self.candidates(url) if (page := self.page_at(row, url)) is not None), None)
