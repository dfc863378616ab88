"""How far the server reads a query, and the tokens it counts for it, against MiniLM's real tokenizer: what the
encoder keeps of the cut query must be what it keeps of the whole one, whatever the text (whitespace the tokenizer
drops, words it makes one [UNK] of), and natural text must still be read in one window."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from local_dense_retriever.demo import mini_wiki
from local_dense_retriever.retrieval.query_reader import CHARS_PER_KEPT_TOKEN, LONG_WORD, QueryReader

# The two queries: the question after 9,000 newlines, and after 60 words of 150 letters. Both are over
# 8,192 characters, the server's cut before it read queries with the tokenizer; the tokenizer keeps 8 and 68 tokens.
AFTER_NEWLINES = "Who painted" + "\n" * 9000 + " the Mona Lisa?"
AFTER_LONG_WORDS = " ".join(["x" * 150] * 60) + " Who painted the Mona Lisa?"


@pytest.fixture(scope="module", name="tokenizer")
def tokenizer_fixture():
    return AutoTokenizer.from_pretrained(str(mini_wiki.minilm_model_dir()), use_fast=True)


@pytest.fixture(scope="module", name="byte_level")
def byte_level_fixture(tokenizer_dir):
    """Qwen2.5's byte-level BPE tokenizer: it keeps whitespace (as tokens) where BERT's drops it."""
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def kept_ids(tokenizer, text: str, max_length: int = 256, prefix: str = "") -> list[int]:
    """The token ids the encoder keeps of a query (encoders.py tokenizes them so)."""
    return tokenizer(prefix + text, truncation=True, max_length=max_length)["input_ids"]


@pytest.mark.parametrize("query", [AFTER_NEWLINES, AFTER_LONG_WORDS], ids=["after 9,000 newlines", "after long words"])
def test_a_question_after_what_the_tokenizer_drops_or_shortens_is_read_to_its_end(tokenizer, query):
    (read,), (count,) = QueryReader(tokenizer, 256).read([query])
    assert len(query) > 8192
    assert tokenizer.decode(kept_ids(tokenizer, read)).endswith("who painted the mona lisa? [SEP]")
    assert kept_ids(tokenizer, read) == kept_ids(tokenizer, query)
    assert count == len(kept_ids(tokenizer, query)) < 256


def test_a_query_read_past_its_first_window_reaches_the_encoder_as_the_words_it_keeps(tokenizer):
    """What the tokenizer drops is read once, here; the encoder, which tokenizes the query again in a batch, gets
    the kept words one space apart, and a word of 200,000 letters (one [UNK]) cut to LONG_WORD of them."""
    huge_word = "Who painted " + "x" * 200_000 + " the Mona Lisa?"
    (after_newlines, after_huge_word), _ = QueryReader(tokenizer, 256).read([AFTER_NEWLINES, huge_word])
    assert after_newlines == "Who painted the Mona Lisa?"
    assert after_huge_word == "Who painted " + "x" * LONG_WORD + " the Mona Lisa?"
    assert kept_ids(tokenizer, after_huge_word) == kept_ids(tokenizer, huge_word)


def test_a_tokenizer_that_keeps_whitespace_reads_the_newlines_as_one_word_of_tokens(byte_level):
    """Qwen's byte-level BPE makes the 9,000 newlines one word of many tokens, which the kept tokens end inside: the
    query is read to the end of that word, the end of the query, and left whole (one space instead of the newlines
    would change the tokens)."""
    (read,), (count,) = QueryReader(byte_level, 256).read([AFTER_NEWLINES])
    assert read == AFTER_NEWLINES
    assert kept_ids(byte_level, read) == kept_ids(byte_level, AFTER_NEWLINES) and count == 256


def test_natural_text_is_read_in_one_window_and_counted_at_max_length(tokenizer):
    """200 KB of words: the first window (2,048 characters) holds more than 256 tokens of whole words, so that is all
    the tokenizer reads (here and again in the encoder), as the 4.9 MB query that took 7 s needs."""
    huge = "word " * 40_000
    (read,), (count,) = QueryReader(tokenizer, 256).read([huge])
    assert read == huge[: CHARS_PER_KEPT_TOKEN * 256]
    assert count == 256
    assert kept_ids(tokenizer, read) == kept_ids(tokenizer, huge)


def test_a_window_that_ends_inside_a_word_the_kept_tokens_reach_is_widened(tokenizer):
    """At max_length 8 the first window ends inside a word of 300 letters, which the tokenizer makes one [UNK] of,
    but of its first letters several pieces, and the kept tokens reach them: the window is doubled until the word
    ends inside it, and the encoder keeps [UNK] f g as it would of the whole query."""
    query = "a b c " + "x" * 300 + " f g h"
    first_window = query[: CHARS_PER_KEPT_TOKEN * 8]
    assert tokenizer.decode(kept_ids(tokenizer, first_window, 8)) == "[CLS] a b c xxxxxx [SEP]"
    (read,), (count,) = QueryReader(tokenizer, 8).read([query])
    assert len(read) > len(first_window)
    assert tokenizer.decode(kept_ids(tokenizer, read, 8)) == "[CLS] a b c [UNK] f g [SEP]"
    assert count == 8


def test_counts_are_the_tokens_the_encoder_keeps_and_short_queries_are_left_whole(tokenizer):
    queries = ["", "   ", "Who painted the Mona Lisa?", "Zürich 苏黎世 😀", "word " * 300, AFTER_NEWLINES]
    read, counts = QueryReader(tokenizer, 64).read(queries)
    assert read[:4] == queries[:4]
    assert counts == [len(kept_ids(tokenizer, query, 64)) for query in queries] == [2, 2, 8, 7, 64, 8]


def test_the_encoders_query_prefix_is_read_and_counted_with_the_query(tokenizer):
    """E5 puts "query: " before every query: two more tokens, the same cut."""
    reader = QueryReader(tokenizer, 256, prefix="query: ")
    (read, _), counts = reader.read([AFTER_NEWLINES, "Who painted the Mona Lisa?"])
    assert counts == [10, 10]
    assert read == "Who painted the Mona Lisa?"  # the prefix's words are the encoder's to add
    assert kept_ids(tokenizer, read, prefix="query: ") == kept_ids(tokenizer, AFTER_NEWLINES, prefix="query: ")


def test_a_tokenizer_that_keeps_the_end_of_a_query_reads_it_whole(tokenizer):
    left = AutoTokenizer.from_pretrained(str(mini_wiki.minilm_model_dir()), use_fast=True, truncation_side="left")
    huge = "word " * 4000 + "Mona Lisa"
    (read,), (count,) = QueryReader(left, 16).read([huge])
    assert read == huge and count == 16


def test_a_reader_that_transformers_left_truncating_still_counts_every_token(tokenizer):
    """transformers leaves the last truncation it used on the tokenizer's backend; the reader's copy has none."""
    tokenizer(["warm"], truncation=True, max_length=4)
    reader = QueryReader(tokenizer, 256)
    assert reader.read(["Who painted the Mona Lisa in the early sixteenth century?"])[1] == [13]
    assert reader.copy().read(["Who painted the Mona Lisa in the early sixteenth century?"])[1] == [13]


WORDS = st.sampled_from(["a", "mona", "lisa", "?", "x" * 40, "y" * 120, "z" * 400, "苏黎世", "Zürich", "e\u0301"])
GAPS = st.sampled_from([" ", "\n", "\t", "  \n\n ", " " * 70, "\n" * 200, "\u3000", "\x00"])


READERS: dict[tuple[str, int], QueryReader] = {}


@pytest.mark.parametrize("which", ["wordpiece", "byte-level"])
@settings(max_examples=50, deadline=None)
@given(parts=st.lists(st.tuples(WORDS, GAPS), max_size=60), max_length=st.sampled_from([4, 8, 16]))
def test_what_the_encoder_keeps_of_the_query_read_is_what_it_keeps_of_the_whole_one(
    tokenizer, byte_level, which, parts, max_length
):
    """Small --max_length values put the window (CHARS_PER_KEPT_TOKEN characters per kept token) among words, long
    words and runs of whitespace of every kind; MiniLM's WordPiece drops the whitespace, Qwen's byte-level BPE
    keeps it."""
    chosen = tokenizer if which == "wordpiece" else byte_level
    key = (which, max_length)
    if key not in READERS:  # a reader copies its tokenizer: Qwen's takes a while
        READERS[key] = QueryReader(chosen, max_length)
    query = "".join(word + gap for word, gap in parts)
    (read,), (count,) = READERS[key].read([query])
    assert kept_ids(chosen, read, max_length) == kept_ids(chosen, query, max_length)
    assert count == len(kept_ids(chosen, query, max_length))
