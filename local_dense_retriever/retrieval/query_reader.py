"""How much of each query the encoder reads, and how many tokens it encodes it at, found with its own tokenizer.

The encoder keeps the first --max_length tokens of a query, but a tokenizer reads the whole text before it truncates
(4.9 MB of text took 7 s and 674 MB here). So a query is read in a window of CHARS_PER_KEPT_TOKEN characters per
kept token, and the window is doubled until the tokens the encoder keeps all come from words that end inside it
(the window's last word may be cut) or it holds the whole query. A tokenizer splits text into words first and
tokenizes each word on its own, so those tokens are the ones it gives for the whole query: whitespace it drops
(9,000 newlines inside a question) and long words it makes one [UNK] of are read, however long, and natural text
(4-5 characters per token) is read in one window. A tokenizer that does not split into words, or keeps the last
tokens of a query, reads it whole.

The counts are what the batcher bounds its batches by; the text read is what the encoder then tokenizes again, in a
batch. A query read past its first window reaches it as the words its kept tokens come from, one space apart and a
word over LONG_WORD characters cut to that many, when the tokenizer gives the same kept tokens for that (checked
each time): then megabytes of whitespace, or one word of megabytes, cost one read here and not a stalled batch.
"""

import copy

# The first window: 2,048 characters for 256 kept tokens. Natural text spends 4-5 characters per token, so it is read
# in one window, and a long query costs the tokenizer no more than its kept tokens need (twice: here and in the
# encoder, which tokenizes the cut query again).
CHARS_PER_KEPT_TOKEN = 8
# Far over any tokenizer's longest word (BERT's WordPiece makes one [UNK] of a word over 100 characters).
LONG_WORD = 1000


class QueryReader:
    """One per thread (a fast tokenizer shared across threads has returned wrong token ids here)."""

    def __init__(self, tokenizer, max_length: int, prefix: str = ""):
        self.max_length = max_length
        self.prefix = prefix  # what the encoder puts before every query (E5's "query: "), read with it
        self._specials = tokenizer.num_special_tokens_to_add(pair=False)
        # The backend of a fast tokenizer, with no truncation (transformers leaves its last setting on it).
        self._backend = copy.deepcopy(tokenizer.backend_tokenizer) if tokenizer.is_fast else None
        if self._backend is not None:
            self._backend.no_truncation()
            self._backend.no_padding()
        self._slow = None if self._backend is not None else copy.deepcopy(tokenizer)
        self._keeps_the_start = getattr(tokenizer, "truncation_side", "right") == "right"

    def copy(self) -> "QueryReader":
        """A reader for another thread."""
        return copy.deepcopy(self)

    def read(self, queries: list[str]) -> tuple[list[str], list[int]]:
        """Each query as far as the encoder needs to read it, and the tokens (special ones included) it is encoded
        at: what the encoder keeps of the cut query is what it would keep of the whole one."""
        if self._backend is None:  # a slow tokenizer: no words to tell where to cut, so every query is read whole
            ids = self._slow([self.prefix + q for q in queries], truncation=True, max_length=self.max_length)
            return list(queries), [len(row) for row in ids["input_ids"]]
        kept = self.max_length - self._specials  # of the query's own tokens (the prefix's included)
        window = CHARS_PER_KEPT_TOKEN * self.max_length
        encodings = self._backend.encode_batch([self.prefix + q[:window] for q in queries], add_special_tokens=False)
        read, counts = [], []
        for query, encoding in zip(queries, encodings, strict=True):
            size = window
            while len(query) > size and not (self._keeps_the_start and _complete(encoding.word_ids, kept)):
                size *= 2
                encoding = self._backend.encode(self.prefix + query[:size], add_special_tokens=False)
            text = query[:size]  # the whole query when it is not longer
            read.append(self._compact(text, encoding, kept) if size > window and self._keeps_the_start else text)
            counts.append(min(len(encoding.ids), kept) + self._specials)
        return read, counts

    def _compact(self, text: str, encoding, kept: int) -> str:
        """The words the kept tokens come from (`encoding`: of the prefix and `text`, what was read of a query), one
        space apart where the text had any gap between them and each cut to LONG_WORD characters, if the tokenizer
        keeps the same tokens of that; else `text`."""
        skip, parts, last_end = len(self.prefix), [], None
        for word in dict.fromkeys(encoding.word_ids[:kept]):
            start, end = encoding.word_to_chars(word)
            if start < skip:  # the prefix's words
                continue
            start, end = start - skip, end - skip
            if last_end is not None:
                parts.append("" if start == last_end else " ")
            parts.append(text[start : min(end, start + LONG_WORD)])
            last_end = end
        compact = "".join(parts)
        same = self._backend.encode(self.prefix + compact, add_special_tokens=False).ids[:kept] == encoding.ids[:kept]
        return compact if same else text


def _complete(words: list[int | None], kept: int) -> bool:
    """The first `kept` tokens all belong to words before the last one (the only word a cut may have changed)."""
    return len(words) > kept and words[kept - 1] is not None and words[kept - 1] != words[-1]
