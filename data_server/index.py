"""An in-memory inverted index over one shard, ranked with BM25.

Postings are kept in compressed-sparse-row form: a single ``array('I')`` for the whole
index, each term owning a contiguous slice of entries that pack the document number
(high 24 bits) with the term frequency (low 8 bits). That is 4 bytes per posting and a
handful of objects per index, instead of one Python object per posting, which matters
when a hundred simulated servers share one machine. Frequencies of 255 or more are
kept exactly in a small side table. Document texts are not retained: a hit carries only
the id, score and title.
"""

from __future__ import annotations

import heapq
import math
import re
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .corpus import Document

__all__ = ["BM25_B", "BM25_K1", "MAX_DOCUMENTS", "Hit", "InvertedIndex", "tokenize"]

BM25_K1 = 1.2
BM25_B = 0.75

_TF_BITS = 8
_TF_MASK = (1 << _TF_BITS) - 1
MAX_DOCUMENTS = 1 << (32 - _TF_BITS)

_TOKEN = re.compile(r"\w+")
# For ASCII text, \w is exactly [A-Za-z0-9_]: mapping every other byte to a space (and
# upper case to lower) and splitting on whitespace gives the same tokens as the regex,
# about twice as fast, and generated corpora are ASCII.
_ASCII_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_ASCII_FOLD = bytes((byte if byte in _ASCII_WORD else 0x20) for byte in range(256)).lower()


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase runs of Unicode word characters (``\\w+``)."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_FOLD).decode("ascii").split()
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: document ``id``, BM25 ``score`` and the document's ``title``."""

    id: str
    score: float
    title: str


class InvertedIndex:
    """BM25-ranked inverted index over a fixed set of documents (title and text).

    Built once from documents and read-only afterwards, so concurrent searches need no
    locking. Construction raises ``ValueError`` if two documents share an id or there
    are more than ``MAX_DOCUMENTS`` documents.
    """

    __slots__ = (
        "_avg_length",
        "_doc_ids",
        "_large_tfs",
        "_norms",
        "_offsets",
        "_postings",
        "_terms",
        "_titles",
    )

    def __init__(self, documents: Iterable[Document]) -> None:
        doc_ids: list[str] = []
        titles: list[str] = []
        lengths: array[int] = array("I")
        term_ids: dict[str, int] = {}
        # Per-term postings while building (one bound append per term, the cheapest
        # per-posting step in CPython); flattened into one CSR array below.
        appenders: dict[str, Callable[[int], None]] = {}
        building: list[array[int]] = []
        large_tfs: dict[tuple[int, int], int] = {}
        tf_mask = _TF_MASK
        for number, document in enumerate(documents):
            if number >= MAX_DOCUMENTS:
                raise ValueError(f"too many documents for one index (max {MAX_DOCUMENTS})")
            doc_ids.append(document.id)
            titles.append(document.title)
            tokens = tokenize(f"{document.title}\n{document.text}")
            lengths.append(len(tokens))
            counts = Counter(tokens)
            # One C-level max per document keeps the rare overflow check out of the
            # per-posting loop.
            if counts and max(counts.values()) >= tf_mask:
                for term, tf in counts.items():
                    if tf >= tf_mask:
                        if term not in appenders:
                            self._add_term(term, term_ids, appenders, building)
                        large_tfs[term_ids[term], number] = tf
                        counts[term] = tf_mask
            base = number << _TF_BITS
            for term, tf in counts.items():
                try:
                    appenders[term](base | tf)
                except KeyError:
                    self._add_term(term, term_ids, appenders, building)
                    appenders[term](base | tf)
        del appenders
        if len(set(doc_ids)) != len(doc_ids):
            duplicate = next(doc_id for doc_id, n in Counter(doc_ids).items() if n > 1)
            raise ValueError(f"duplicate document id {duplicate!r}")

        offsets: array[int] = array("I", [0])
        flat: array[int] = array("I")
        for postings in building:
            flat.extend(postings)
            offsets.append(len(flat))

        total = sum(lengths)
        avg_length = total / len(doc_ids) if total else 1.0
        self._doc_ids = doc_ids
        self._titles = titles
        self._avg_length = avg_length
        # The length-dependent part of the BM25 denominator, precomputed per document.
        self._norms: array[float] = array(
            "d", (BM25_K1 * (1.0 - BM25_B + BM25_B * length / avg_length) for length in lengths)
        )
        self._terms = term_ids
        self._offsets = offsets
        self._postings = flat
        self._large_tfs = large_tfs

    @staticmethod
    def _add_term(
        term: str,
        term_ids: dict[str, int],
        appenders: dict[str, Callable[[int], None]],
        building: list[array[int]],
    ) -> None:
        # Interned so that the simulated servers of a fleet, which share a vocabulary,
        # also share the term strings.
        term = sys.intern(term)
        term_ids[term] = len(building)
        postings: array[int] = array("I")
        building.append(postings)
        appenders[term] = postings.append

    @property
    def document_count(self) -> int:
        """Number of indexed documents."""
        return len(self._doc_ids)

    @property
    def term_count(self) -> int:
        """Number of distinct terms."""
        return len(self._terms)

    @property
    def posting_count(self) -> int:
        """Number of (term, document) pairs stored."""
        return len(self._postings)

    @property
    def average_length(self) -> float:
        """Mean document length in tokens (1.0 for an empty index)."""
        return self._avg_length

    def document_frequency(self, term: str) -> int:
        """Number of documents containing ``term`` (which is lowercased first)."""
        term_id = self._terms.get(term.lower())
        if term_id is None:
            return 0
        return self._offsets[term_id + 1] - self._offsets[term_id]

    def idf(self, term: str) -> float:
        """Lucene-style BM25 idf of ``term``: ``log(1 + (N - df + 0.5) / (df + 0.5))``."""
        df = self.document_frequency(term)
        return math.log(1.0 + (self.document_count - df + 0.5) / (df + 0.5))

    def _query_terms(self, query: str) -> list[int]:
        # Each distinct term counts once, in first-seen order so that float sums (and so
        # tie-breaking) do not depend on set iteration order.
        term_ids: list[int] = []
        for term in dict.fromkeys(tokenize(query)):
            term_id = self._terms.get(term)
            if term_id is not None:
                term_ids.append(term_id)
        return term_ids

    def _scores(self, query: str) -> dict[int, float]:
        scores: dict[int, float] = {}
        get = scores.get
        count = len(self._doc_ids)
        offsets = self._offsets
        norms = self._norms
        large_tfs = self._large_tfs
        k1_plus_1 = BM25_K1 + 1.0
        for term_id in self._query_terms(query):
            start, end = offsets[term_id], offsets[term_id + 1]
            df = end - start
            weight = math.log(1.0 + (count - df + 0.5) / (df + 0.5)) * k1_plus_1
            for entry in self._postings[start:end]:
                number = entry >> _TF_BITS
                tf = entry & _TF_MASK
                if tf == _TF_MASK:
                    tf = large_tfs[term_id, number]
                scores[number] = get(number, 0.0) + weight * tf / (tf + norms[number])
        return scores

    def match_count(self, query: str) -> int:
        """Number of documents containing at least one term of ``query``."""
        term_ids = self._query_terms(query)
        offsets = self._offsets
        if len(term_ids) == 1:
            return offsets[term_ids[0] + 1] - offsets[term_ids[0]]
        matched: set[int] = set()
        for term_id in term_ids:
            matched.update(
                entry >> _TF_BITS
                for entry in self._postings[offsets[term_id] : offsets[term_id + 1]]
            )
        return len(matched)

    def search(self, query: str, k: int) -> list[Hit]:
        """Return the top ``k`` documents for ``query`` by BM25 score, best first.

        Query terms are OR-ed, each distinct term counted once; unknown terms add
        nothing, so an empty or all-unknown query returns ``[]``. Equal scores are
        ordered by document id. Raises ``ValueError`` if ``k`` is negative.
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        scores = self._scores(query) if k else {}
        candidates = scores.items()
        if len(scores) > k:
            # Select by score alone (cheap), then keep everything tied with the k-th
            # score so that the id tie-break below is exact at the cut.
            threshold = heapq.nlargest(k, scores.values())[-1]
            candidates = {n: s for n, s in scores.items() if s >= threshold}.items()
        doc_ids = self._doc_ids
        top = sorted(candidates, key=lambda item: (-item[1], doc_ids[item[0]]))[:k]
        titles = self._titles
        return [Hit(doc_ids[number], score, titles[number]) for number, score in top]
