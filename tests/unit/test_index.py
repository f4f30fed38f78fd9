"""The shard's documents (generated or loaded) and its BM25 inverted index."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
import string
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_server.corpus import (
    MAX_DOC_TOKENS,
    MIN_DOC_TOKENS,
    VOCABULARY_SIZE,
    Document,
    generate_documents,
    load_jsonl,
    sample_queries,
    vocabulary,
)
from data_server.handlers import MAX_SCORE
from data_server.index import (
    BM25_B,
    BM25_K1,
    MAX_DOCUMENTS,
    Hit,
    InvertedIndex,
    score_bound,
    tokenize,
)
from data_server.searching import run_search, work_deadline
from discovery.http import MAX_QUERY_LENGTH
from search_server import merging
from tests.support import frequent_terms


def doc(doc_id: str, text: str, title: str = "") -> Document:
    return Document(id=doc_id, title=title, text=text)


def bm25_term(tf: int, dl: int, avgdl: float, n: int, df: int) -> float:
    """The BM25 formula written out independently of the index."""
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * dl / avgdl))


def brute_force(documents: list[Document], query: str, k: int) -> list[tuple[str, float]]:
    """Score every document from its raw text: the reference the index must match."""
    tokenized = [re.findall(r"\w+", f"{d.title}\n{d.text}".lower()) for d in documents]
    avgdl = sum(map(len, tokenized)) / len(tokenized)
    terms = list(dict.fromkeys(re.findall(r"\w+", query.lower())))
    counts = [Counter(tokens) for tokens in tokenized]
    scored = []
    for document, tokens, tf in zip(documents, tokenized, counts, strict=True):
        score = 0.0
        for term in terms:
            if tf[term]:
                df = sum(1 for c in counts if c[term])
                score += bm25_term(tf[term], len(tokens), avgdl, len(documents), df)
        if score:
            scored.append((document.id, score))
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored[:k]


# --- generated corpus -------------------------------------------------------------------


def test_generation_is_deterministic() -> None:
    first = generate_documents(40, shard=3, seed=7)
    assert first == generate_documents(40, shard=3, seed=7)
    assert [d.id for d in first] == [f"s3-{n}" for n in range(40)]
    # Document n does not depend on how many are generated.
    assert generate_documents(10, shard=3, seed=7) == first[:10]


def test_generation_differs_by_shard_and_seed() -> None:
    base = generate_documents(20, shard=1)
    other_shard = generate_documents(20, shard=2)
    other_seed = generate_documents(20, shard=1, seed=1)
    assert [d.text for d in base] != [d.text for d in other_shard]
    assert {d.text for d in base}.isdisjoint(d.text for d in other_shard)
    assert {d.text for d in base}.isdisjoint(d.text for d in other_seed)


def test_generated_documents_look_like_documents() -> None:
    documents = generate_documents(300, shard=0)
    lengths = [len(tokenize(d.text)) for d in documents]
    assert min(lengths) >= MIN_DOC_TOKENS
    assert max(lengths) <= MAX_DOC_TOKENS
    assert len(set(lengths)) > 50, "lengths should vary"
    words = set(vocabulary(0))
    for document in documents:
        assert document.title
        assert set(tokenize(document.title)) <= set(tokenize(document.text))
        assert set(tokenize(document.text)) <= words
        assert document.text.endswith(".")
        assert document.text[0].isupper()


def test_generation_rejects_negative_arguments() -> None:
    assert generate_documents(0, shard=0) == []
    with pytest.raises(ValueError, match="count"):
        generate_documents(-1, shard=0)
    with pytest.raises(ValueError, match="shard"):
        generate_documents(1, shard=-1)


def test_vocabulary_is_large_unique_and_cached() -> None:
    words = vocabulary(0)
    assert len(words) == VOCABULARY_SIZE
    assert len(set(words)) == len(words)
    assert all(re.fullmatch(r"[a-z]+", w) for w in words)
    assert vocabulary(0) is words
    assert vocabulary(1) != words
    # Frequent words are short, as in natural language.
    head = sum(map(len, words[:100])) / 100
    tail = sum(map(len, words[-1000:])) / 1000
    assert head < tail


def test_word_frequencies_are_zipf_like() -> None:
    counts = Counter(t for d in generate_documents(2000, shard=5) for t in tokenize(d.text))
    frequencies = sorted(counts.values(), reverse=True)
    # Zipf with s ~ 1 predicts f(1) / f(100) ~ 100 (about 126 for s = 1.05).
    assert frequencies[0] > 40 * frequencies[99]
    assert frequencies[0] < 400 * frequencies[99]
    # Log-log slope between ranks 10 and 1000 is close to -s.
    slope = (math.log(frequencies[999]) - math.log(frequencies[9])) / (
        math.log(1000) - math.log(10)
    )
    assert -1.3 < slope < -0.8
    # A long tail: many distinct words, a good share of them seen once or twice.
    assert len(counts) > 10_000


def test_sample_queries_are_deterministic_short_and_from_the_vocabulary() -> None:
    queries = sample_queries(200, seed=0)
    assert queries == sample_queries(200, seed=0)
    assert queries != sample_queries(200, seed=0, variant=1)
    words = vocabulary(0)
    common = set(words[:50])
    known = set(words)
    sizes = Counter(len(q.split()) for q in queries)
    assert set(sizes) == {1, 2, 3}
    for query in queries:
        terms = query.split()
        assert len(set(terms)) == len(terms)
        assert set(terms) <= known
        assert not set(terms) & common, "queries avoid stop words"
    with pytest.raises(ValueError, match="count"):
        sample_queries(-1)


def test_sample_queries_hit_a_realistic_share_of_a_shard() -> None:
    index = InvertedIndex(generate_documents(5000, shard=1))
    queries = sample_queries(200, seed=0)
    shares = [index.match_count(q) / index.document_count for q in queries]
    realistic = [s for s in shares if 0 < s < 0.5]
    assert len(realistic) >= 0.95 * len(queries)
    # Neither all rare nor all common: a spread of hit counts.
    assert min(shares) < 0.01
    assert max(shares) > 0.05
    assert all(index.search(q, 10) for q in queries if index.match_count(q))


# --- JSONL loading ----------------------------------------------------------------------


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_jsonl(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "docs.jsonl",
        [
            json.dumps({"id": "a", "title": "Alpha", "text": "first text", "extra": 1}),
            "",
            "   ",
            json.dumps({"id": "b", "text": "second text"}),
            json.dumps({"id": "c", "title": None, "text": "Zürich ünïcode"}),
        ],
    )
    assert load_jsonl(path) == [
        Document("a", "Alpha", "first text"),
        Document("b", "", "second text"),
        Document("c", "", "Zürich ünïcode"),
    ]
    assert load_jsonl(str(path)) == load_jsonl(path)


def test_load_jsonl_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("", encoding="utf-8")
    assert load_jsonl(path) == []


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('["a", "list"]', "expected a JSON object"),
        ('{"text": "no id"}', "'id' must be a non-empty string"),
        ('{"id": "", "text": "empty id"}', "'id' must be a non-empty string"),
        ('{"id": 5, "text": "numeric id"}', "'id' must be a non-empty string"),
        ('{"id": "x"}', "'text' must be a string"),
        ('{"id": "x", "text": "t", "title": 3}', "'title' must be a string"),
        ('{"id": "a", "text": "again"}', "duplicate id 'a' \\(first on line 1\\)"),
    ],
)
def test_load_jsonl_bad_line_names_file_and_line(
    tmp_path: Path, bad_line: str, message: str
) -> None:
    path = write_lines(
        tmp_path / "docs.jsonl",
        ['{"id": "a", "text": "ok"}', "", bad_line, '{"id": "z", "text": "never read"}'],
    )
    with pytest.raises(ValueError, match=message) as info:
        load_jsonl(path)
    assert str(info.value).startswith(f"{path}, line 3: ")


def test_load_jsonl_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "\xff"}\n')
    with pytest.raises(ValueError, match=r"line 2: not valid UTF-8"):
        load_jsonl(path)


def test_load_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_jsonl(tmp_path / "absent.jsonl")


# --- tokenizer --------------------------------------------------------------------------


def test_tokenize() -> None:
    assert tokenize("Hello, World! snake_case x2 -- ok.") == [
        "hello",
        "world",
        "snake_case",
        "x2",
        "ok",
    ]
    assert tokenize("Café NAÏVE 東京 Straße") == ["café", "naïve", "東京", "straße"]
    assert tokenize("") == []
    assert tokenize(" ,.;\n\t") == []


def test_ascii_fast_path_matches_the_regex() -> None:
    rng = random.Random(1)
    alphabet = string.printable + "\x00\x1c\x1f\x7f"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert tokenize(text) == re.findall(r"\w+", text.lower()), repr(text)


# --- BM25 -------------------------------------------------------------------------------


def test_higher_term_frequency_ranks_higher_at_equal_length() -> None:
    index = InvertedIndex(
        [doc("once", "apple pear plum fig"), doc("twice", "apple apple plum fig"), doc("no", "x")]
    )
    hits = index.search("apple", 10)
    assert [h.id for h in hits] == ["twice", "once"]
    assert hits[0].score > hits[1].score


def test_shorter_document_ranks_higher_at_equal_term_frequency() -> None:
    index = InvertedIndex(
        [doc("long", "apple b c d e f g h i j"), doc("short", "apple b c"), doc("other", "z")]
    )
    assert [h.id for h in index.search("apple", 10)] == ["short", "long"]


def test_rare_terms_outweigh_common_ones() -> None:
    documents = [doc(f"filler{n}", "common words here") for n in range(8)]
    documents += [doc("has-common", "common alpha beta"), doc("has-rare", "rare alpha beta")]
    index = InvertedIndex(documents)
    assert index.idf("rare") > index.idf("common")
    hits = index.search("common rare", 3)
    assert hits[0].id == "has-rare"


def test_score_matches_hand_computation() -> None:
    documents = [
        doc("d1", "the cat sat on the mat", title="Cats"),
        doc("d2", "the dog sat"),
        doc("d3", "a cat and a cat and a dog"),
        doc("d4", "nothing relevant at all"),
    ]
    index = InvertedIndex(documents)
    # Lengths include the title: d1 = 7, d2 = 3, d3 = 8, d4 = 4 tokens.
    avgdl = (7 + 3 + 8 + 4) / 4
    assert index.average_length == avgdl
    # "cats" (title of d1) is a different token from "cat": df(cat) = 2, df(dog) = 2.
    expected_d3 = bm25_term(2, 8, avgdl, 4, 2) + bm25_term(1, 8, avgdl, 4, 2)
    expected_d1 = bm25_term(1, 7, avgdl, 4, 2)
    expected_d2 = bm25_term(1, 3, avgdl, 4, 2)
    hits = {h.id: h.score for h in index.search("Cat DOG cat", 10)}
    assert set(hits) == {"d1", "d2", "d3"}
    assert hits["d3"] == pytest.approx(expected_d3, abs=1e-9)
    assert hits["d1"] == pytest.approx(expected_d1, abs=1e-9)
    assert hits["d2"] == pytest.approx(expected_d2, abs=1e-9)
    assert index.idf("cat") == pytest.approx(math.log(1 + (4 - 2 + 0.5) / (2 + 0.5)), abs=1e-12)


def test_title_is_indexed_and_returned() -> None:
    index = InvertedIndex([doc("a", "body text", title="Unique Heading"), doc("b", "other")])
    [hit] = index.search("heading", 5)
    assert (hit.id, hit.title) == ("a", "Unique Heading")
    assert isinstance(hit, Hit)


def test_large_term_frequencies_are_exact() -> None:
    documents = [
        doc("many", " ".join(["spam"] * 300 + ["eggs"] * 255 + ["ham"] * 254)),
        doc("few", "spam eggs ham toast"),
    ]
    index = InvertedIndex(documents)
    reference = dict(brute_force(documents, "spam eggs ham", 10))
    hits = {h.id: h.score for h in index.search("spam eggs ham", 10)}
    assert hits == pytest.approx(reference, abs=1e-9)
    # 300 and 255 are past the packed 8-bit field; clamping would have lowered the score.
    clamped = sum(bm25_term(tf, 809, index.average_length, 2, 2) for tf in (255, 255, 254))
    assert hits["many"] > clamped


def test_index_matches_brute_force_on_a_generated_shard() -> None:
    documents = generate_documents(300, shard=9)
    index = InvertedIndex(documents)
    words = vocabulary(0)
    queries = [
        *sample_queries(30, seed=0),
        " ".join(words[:3]),  # stop words: nearly every document matches
        f"{words[0]} {words[0].upper()} unknownword",
    ]
    for query in queries:
        expected = brute_force(documents, query, 10)
        hits = index.search(query, 10)
        assert [h.id for h in hits] == [i for i, _ in expected], query
        assert [h.score for h in hits] == pytest.approx([s for _, s in expected], abs=1e-9)


# --- search API -------------------------------------------------------------------------


def test_top_k_is_ordered_and_limited() -> None:
    documents = [doc(f"d{n:02}", " ".join(["word"] * (n + 1) + ["pad"] * 20)) for n in range(30)]
    index = InvertedIndex(documents)
    hits = index.search("word", 5)
    assert len(hits) == 5
    assert [h.id for h in hits] == ["d29", "d28", "d27", "d26", "d25"]
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert len(index.search("word", 100)) == 30
    assert index.search("word", 0) == []
    with pytest.raises(ValueError, match="k must be >= 0"):
        index.search("word", -1)


def test_ties_are_broken_by_document_id() -> None:
    documents = [doc(i, "same text here") for i in ["c", "a", "e", "b", "d"]]
    index = InvertedIndex(documents)
    assert [h.id for h in index.search("same", 3)] == ["a", "b", "c"]
    assert [h.id for h in index.search("text same", 10)] == ["a", "b", "c", "d", "e"]


def test_repeated_query_terms_count_once() -> None:
    index = InvertedIndex([doc("a", "apple pie"), doc("b", "banana split"), doc("c", "apple")])
    assert index.search("apple apple APPLE", 5) == index.search("apple", 5)


def test_unknown_and_empty_queries() -> None:
    index = InvertedIndex([doc("a", "apple pie"), doc("b", "banana split")])
    assert index.search("", 10) == []
    assert index.search("  ?! ", 10) == []
    assert index.search("durian", 10) == []
    assert [h.id for h in index.search("durian pie", 10)] == ["a"]
    assert index.match_count("durian") == 0
    assert index.match_count("pie banana apple") == 2


def test_counts_and_empty_index() -> None:
    index = InvertedIndex([doc("a", "apple pie"), doc("b", "Apple split", title="Fruit")])
    assert index.document_count == 2
    assert index.term_count == 4
    assert index.posting_count == 5
    assert index.document_frequency("APPLE") == 2
    empty = InvertedIndex([])
    assert empty.document_count == 0
    assert empty.term_count == 0
    assert empty.search("anything", 10) == []
    blank = InvertedIndex([doc("x", ""), doc("y", "...")])
    assert blank.search("x", 10) == []


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate document id 'a'"):
        InvertedIndex([doc("a", "one"), doc("b", "two"), doc("a", "three")])


# --- pruning, slices and deadlines -------------------------------------------------------


@pytest.fixture(scope="module")
def shard() -> InvertedIndex:
    return InvertedIndex(generate_documents(2000, shard=4))


# Zipf-like: a word's weight is its number of copies, so documents share frequent words
# (ties, long postings, queries that close early) and differ in rare ones.
_WORDS = [word for rank, word in enumerate("abcdefghij") for _ in range(10 // (rank + 1))]


@st.composite
def corpora(draw: st.DrawFn) -> list[Document]:
    count = draw(st.integers(1, 30))
    documents = []
    for n in range(count):
        if draw(st.booleans()):
            tokens = draw(st.lists(st.sampled_from(_WORDS), max_size=25))
        else:
            # Short documents of repeated words: a term's bound (its largest frequency
            # in the shortest document) is then nearly reached, so a document can win
            # on the terms read last alone.
            runs = draw(st.lists(st.tuples(st.sampled_from(_WORDS), st.integers(1, 6)), max_size=4))
            tokens = [word for word, times in runs for _ in range(times)]
        if draw(st.integers(0, 15)) == 0:
            # Past the packed 8-bit frequency: the side table and its bound.
            tokens += [draw(st.sampled_from(_WORDS))] * draw(st.integers(250, 300))
        documents.append(doc(f"d{n:02}", " ".join(tokens), title=draw(st.sampled_from("xy"))))
    # Identical documents make exact ties, broken by id.
    copies = draw(st.integers(0, 3))
    documents += [dataclasses.replace(documents[0], id=f"z{n}") for n in range(copies)]
    return documents


@settings(derandomize=True, database=None, deadline=None, max_examples=400)
@given(
    documents=corpora(),
    words=st.lists(st.sampled_from([*"abcdefghij", "unknown"]), max_size=12),
    k=st.integers(0, 12),
    quota=st.integers(1, 40),
)
def test_pruned_search_equals_the_exhaustive_one(
    documents: list[Document], words: list[str], k: int, quota: int
) -> None:
    index = InvertedIndex(documents)
    query = " ".join(words)
    expected = index.search_exhaustive(query, k)

    hits = index.search(query, k)

    assert [h.id for h in hits] == [h.id for h in expected]
    assert [h.title for h in hits] == [h.title for h in expected]
    assert [h.score for h in hits] == pytest.approx([h.score for h in expected], rel=1e-12)
    # In small steps, the same answer; before it, best-so-far lists of partial scores
    # (lower bounds of the documents' scores), best first.
    every_score = {h.id: h.score for h in index.search_exhaustive(query, len(documents))}
    search = index.start_search(query, k)
    while not search.step(quota):
        partial = search.hits()
        assert len(partial) <= k
        assert [h.score for h in partial] == sorted((h.score for h in partial), reverse=True)
        assert all(h.score <= every_score[h.id] * (1 + 1e-12) for h in partial)
    assert search.hits() == hits


@settings(derandomize=True, database=None, deadline=None, max_examples=100)
@given(
    documents=corpora(),
    words=st.lists(st.sampled_from([*"abcdefghij", "unknown"]), max_size=12),
)
def test_no_score_reaches_the_bound(documents: list[Document], words: list[str]) -> None:
    index = InvertedIndex(documents)
    query = " ".join(words)
    bound = score_bound(len(documents), len(set(tokenize(query))))
    for hit in index.search_exhaustive(query, len(documents)):
        assert 0 <= hit.score < bound


def test_a_rare_term_in_a_short_document_stays_under_the_bound() -> None:
    # The largest a term adds: in one document of many, as often as can be, in a
    # document far shorter than the average (its norm at its least).
    documents = [doc("rare", "needle " * 25)] + [doc(f"d{n}", "hay " * 500) for n in range(2000)]
    hit = InvertedIndex(documents).search("needle", 1)[0]
    assert hit.id == "rare"
    assert 0.9 * score_bound(len(documents), 1) < hit.score < score_bound(len(documents), 1)


def test_the_data_server_s_scores_are_within_what_search_servers_accept() -> None:
    # The longest query the data server takes has at most this many distinct terms.
    longest = " ".join(chr(0x4E00 + n) for n in range((MAX_QUERY_LENGTH + 1) // 2))
    assert len(longest) <= MAX_QUERY_LENGTH
    assert len(set(tokenize(longest))) == (MAX_QUERY_LENGTH + 1) // 2
    assert score_bound(MAX_DOCUMENTS, (MAX_QUERY_LENGTH + 1) // 2) == MAX_SCORE
    assert MAX_SCORE < merging.MAX_SCORE / 1000


def test_pruning_reads_a_fraction_of_a_frequent_term_query(shard: InvertedIndex) -> None:
    query = frequent_terms(shard, 150)
    search = shard.start_search(query, 10)
    while not search.step(1 << 20):
        pass
    # The exhaustive search reads every posting of the query's terms; pruning stops
    # reading most of those of the frequent ones and looks documents up instead.
    assert search.lookups > 0
    assert search.postings_read + search.lookups < 0.75 * search.posting_volume
    expected = shard.search_exhaustive(query, 10)
    assert [h.id for h in search.hits()] == [h.id for h in expected]
    assert [h.score for h in search.hits()] == pytest.approx([h.score for h in expected])


def test_a_document_can_win_on_the_terms_read_last_alone() -> None:
    # "rare" is read first (the larger bound): after it the best score is the long
    # document's, 0.83, and the bound of "common" is 0.87, reached by the short document
    # that has no "rare" at all. Closing the query to new documents any earlier (at a
    # bound 5% above the best score) would miss the winner.
    filler = " ".join(f"filler{n}" for n in range(30))
    index = InvertedIndex(
        [doc("long", f"rare {filler}"), doc("short", "common common"), doc("o", f"common {filler}")]
    )
    assert [h.id for h in index.search("common rare", 1)] == ["short"]
    assert index.search("common rare", 3) == index.search_exhaustive("common rare", 3)


@pytest.mark.parametrize(
    ("texts", "query", "k"),
    [
        (["d b h e", "h", "d h f e"], "g d h f e b", 3),
        (["e a a c a b b", "b a b e b c a"], "g f c h a b d", 2),
        (["f g h c", "c h b d"], "h d e b f a c g", 1),
        # These two need the slack: the sums in reading order are a bit apart, in the
        # opposite order of the exhaustive search's.
        (
            [
                "a a h a b h g",
                "g a f h c a c e",
                "c a g h b a g f",
                "f f h",
                "d g c e d b f",
                "c h e d",
            ],
            "f b g c e h a",
            5,
        ),
        (["h f e", "b f a", "f b d", "d h g f", "h b h g e h", "g c h"], "g b c d a e", 1),
    ],
)
def test_sums_in_reading_order_do_not_reorder_near_ties(
    texts: list[str], query: str, k: int
) -> None:
    # Found by search: documents whose scores, summed in the pruned search's reading
    # order, tie or swap where the exhaustive search's sums (query order) differ in the
    # last bit. The candidates within the slack of a neighbour are rescored.
    index = InvertedIndex([doc(f"d{n}", text) for n, text in enumerate(texts)])
    hits, expected = index.search(query, k), index.search_exhaustive(query, k)
    assert [h.id for h in hits] == [h.id for h in expected]
    assert [h.score for h in hits] == pytest.approx([h.score for h in expected], rel=1e-12)


def test_a_search_advances_in_bounded_steps(shard: InvertedIndex) -> None:
    query = frequent_terms(shard, 150)
    search = shard.start_search(query, 10)
    assert search.work == 0  # starting reads nothing
    quota = 1000
    steps = 1
    before = 0
    while not search.step(quota):
        # A step may overrun its quota by one operation on the scores accumulated so
        # far (at most one per document).
        assert search.work - before <= quota + shard.document_count
        before = search.work
        steps += 1
        partial = search.hits()
        assert 0 < len(partial) <= 10
        assert not search.done
    assert search.done
    assert steps >= search.posting_volume // (4 * quota)
    assert search.step(quota)  # done stays done
    assert search.hits() == shard.search(query, 10)


async def test_run_search_stops_at_the_deadline_with_the_best_so_far(
    shard: InvertedIndex,
) -> None:
    query = frequent_terms(shard, 150)
    ticks = itertools.count()

    def clock() -> float:
        return next(ticks) / 1000  # every reading is a millisecond later

    search = shard.start_search(query, 10)
    outcome = await run_search(search, 0.0035, clock=clock, slice_work=1000)

    # Read at 0 and 1 ms (first slice), 2 ms after the yield, 3 and 4 ms (second slice):
    # past the deadline.
    assert outcome.cut
    assert outcome.slices == 2
    assert outcome.longest_slice == pytest.approx(0.001)
    assert not search.done
    assert outcome.hits == search.hits()
    assert 0 < len(outcome.hits) <= 10
    every_score = {h.id: h.score for h in shard.search_exhaustive(query, 2000)}
    assert all(h.score <= every_score[h.id] * (1 + 1e-12) for h in outcome.hits)

    normal = sample_queries(1, variant=3)[0]
    done = await run_search(shard.start_search(normal, 10), 10.0, clock=clock)
    assert not done.cut
    assert done.slices == 1  # an ordinary query never yields
    assert done.hits == shard.search(normal, 10)


def test_the_work_deadline_keeps_a_margin_for_the_answer() -> None:
    # A tenth of the budget, at least 5 ms, at most half of it.
    assert work_deadline(100.0, 1000) == pytest.approx(100.9)
    assert work_deadline(100.0, 20) == pytest.approx(100.015)
    assert work_deadline(100.0, 4) == pytest.approx(100.002)
    assert work_deadline(100.0, 1) == pytest.approx(100.0005)
