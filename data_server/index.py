"""An in-memory inverted index over one shard, ranked with BM25, searched in slices.

A search (:class:`IncrementalSearch`) does a bounded amount of work per
:meth:`~IncrementalSearch.step` and can be stopped at any point with its best hits so
far; run to its end it gives what :meth:`InvertedIndex.search_exhaustive` gives.

Design: docs/design/data-server.md, "The index".
"""

from __future__ import annotations

import heapq
import math
import re
import sys
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
from operator import itemgetter

from .corpus import Document

__all__ = [
    "BM25_B",
    "BM25_K1",
    "MAX_DOCUMENTS",
    "Hit",
    "IncrementalSearch",
    "InvertedIndex",
    "PostingLists",
    "score_bound",
    "tokenize",
]

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


def score_bound(documents: int, terms: int) -> float:
    """A bound no BM25 score of a query of ``terms`` distinct terms reaches, over an index
    of ``documents`` documents (scores are never negative: every idf is positive).

    Each term adds less than its weight, idf * (k1 + 1): ``tf / (tf + norm)`` is below 1,
    every norm being at least k1 * (1 - b) > 0; and a term's idf is largest when it is
    in one document only.
    """
    idf = math.log(1.0 + (max(documents, 1) - 0.5) / 1.5)
    return terms * idf * (BM25_K1 + 1.0)


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


@dataclass(frozen=True, slots=True)
class PostingLists:
    """An index's postings as its searches read them: the index's own arrays, not a copy.

    Term ``t``'s entries are ``entries[offsets[t]:offsets[t + 1]]``, by document number,
    each ``number << 8 | tf``; a ``tf`` of 255 stands for the exact one in
    ``large_tfs[t, number]``. ``norms[number]`` is the document's BM25 length norm.
    """

    offsets: array[int]
    entries: array[int]
    large_tfs: dict[tuple[int, int], int]
    norms: array[float]


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
        "_lists",
        "_max_tfs",
        "_min_norm",
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
        # What a term's upper bound is made of (see IncrementalSearch): its largest
        # frequency, one byte a term, and the smallest length norm of the shard.
        self._max_tfs = _max_frequencies(flat, offsets)
        self._min_norm = min(self._norms) if doc_ids else 1.0
        self._lists = PostingLists(offsets, flat, large_tfs, self._norms)

    def __getstate__(self) -> tuple[None, dict[str, object]]:
        # Pickled (a snapshot) as before _lists existed: it is made of the other slots.
        return None, {name: getattr(self, name) for name in self.__slots__ if name != "_lists"}

    def __setstate__(self, state: tuple[None, dict[str, object]]) -> None:
        for name, value in state[1].items():
            setattr(self, name, value)
        self._lists = PostingLists(self._offsets, self._postings, self._large_tfs, self._norms)

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

    def term_ids(self, query: str) -> list[int]:
        """The ids of ``query``'s indexed terms, each once, in first-seen order."""
        # First-seen order so that float sums (and so tie-breaking) do not depend on set
        # iteration order.
        term_ids: list[int] = []
        for term in dict.fromkeys(tokenize(query)):
            term_id = self._terms.get(term)
            if term_id is not None:
                term_ids.append(term_id)
        return term_ids

    def term_weight(self, term_id: int) -> float:
        """The term's idf times ``k1 + 1``: its contribution is ``weight * tf / (tf + norm)``."""
        df = self._offsets[term_id + 1] - self._offsets[term_id]
        return math.log(1.0 + (len(self._doc_ids) - df + 0.5) / (df + 0.5)) * (BM25_K1 + 1.0)

    def term_bound(self, term_id: int, weight: float) -> float:
        """No document's contribution from this term (of ``weight``) exceeds this, up
        to rounding."""
        top = self._max_tfs[term_id]
        if top == _TF_MASK:
            return weight  # 255 or more, somewhere: tf / (tf + norm) is below 1
        return weight * top / (top + self._min_norm)

    def _scores(self, query: str) -> dict[int, float]:
        scores: dict[int, float] = {}
        get = scores.get
        count = len(self._doc_ids)
        offsets = self._offsets
        norms = self._norms
        large_tfs = self._large_tfs
        k1_plus_1 = BM25_K1 + 1.0
        for term_id in self.term_ids(query):
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
        term_ids = self.term_ids(query)
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

    def start_search(self, query: str, k: int) -> IncrementalSearch:
        """A search for the top ``k`` of ``query``, to be run by :meth:`IncrementalSearch.step`.

        Cheap (the query is tokenized and its terms ordered; no posting is read).
        Raises ``ValueError`` if ``k`` is negative.
        """
        return IncrementalSearch(self, query, k)

    def search(self, query: str, k: int) -> list[Hit]:
        """Return the top ``k`` documents for ``query`` by BM25 score, best first.

        Query terms are OR-ed, each distinct term counted once; unknown terms add
        nothing, so an empty or all-unknown query returns ``[]``. Equal scores are
        ordered by document id. Runs the pruned search (:class:`IncrementalSearch`) to
        its end in one go: the result is that of :meth:`search_exhaustive`. Raises
        ``ValueError`` if ``k`` is negative.
        """
        search = IncrementalSearch(self, query, k)
        while not search.step(_UNLIMITED):
            pass
        return search.hits()

    def search_exhaustive(self, query: str, k: int) -> list[Hit]:
        """:meth:`search` by scoring every posting of every query term (no pruning).

        The reference the pruned search must match, and the benchmarks' baseline.
        Raises ``ValueError`` if ``k`` is negative.
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        scores = self._scores(query) if k else {}
        return self.top(scores, k)

    @property
    def posting_lists(self) -> PostingLists:
        """The postings, for a search to read (the index's own arrays, not a copy)."""
        return self._lists

    def top(self, scores: dict[int, float], k: int) -> list[Hit]:
        """The ``k`` best of ``scores`` by (score descending, document id) as hits."""
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


def _max_frequencies(postings: array[int], offsets: array[int]) -> bytes:
    """Each term's largest (capped) frequency, read from the postings' low bytes at C speed."""
    terms = len(offsets) - 1
    if postings.itemsize == 4:
        low = memoryview(postings).cast("B")[(0 if sys.byteorder == "little" else 3) :: 4]
        return bytes(max(low[offsets[t] : offsets[t + 1]], default=0) for t in range(terms))
    return bytes(  # pragma: no cover - platforms whose unsigned int is not 4 bytes
        max((e & _TF_MASK for e in postings[offsets[t] : offsets[t + 1]]), default=0)
        for t in range(terms)
    )


# Work units of IncrementalSearch.step: one unit is one posting read while new documents
# may still enter (~0.25 us in CPython, the exhaustive search's cost per posting). Once
# the query is closed to new documents a posting read is a dictionary miss, mostly: two
# count as one unit. A binary search in a term's postings costs 2 units; a selection or
# filter over the accumulated scores, 1 unit per 4 scores. The data server's slices are
# a number of units (see data_server/searching.py).
_LOOKUP_WORK = 2
# A lookup costs about as much as reading 9 postings of a closed query: below that
# ratio of documents to postings, a term is searched rather than read.
_LOOKUP_RATIO = 9
_UNLIMITED = 1 << 62
# Relative slack of every pruning comparison (see the module doc, "Exactness").
_SLACK = 1e-9

_TERMS, _RESCORE, _DONE = 0, 1, 2


class IncrementalSearch:
    """One top-k BM25 search, advanced a bounded amount of work at a time.

    Made by :meth:`InvertedIndex.start_search`. Call :meth:`step` until it returns
    True; between calls the caller may do anything else, or stop and take the best
    hits so far from :meth:`hits` (then ``done`` is False and the scores are partial
    sums: lower bounds of the true ones). Pure computation: no clock, no I/O; a step
    never raises. See the module doc for the algorithm.

    ``work`` is the work done so far, in units of about one posting read (see
    ``_LOOKUP_WORK``); ``postings_read`` and ``lookups`` (binary searches in a term's
    postings) say what pruning left to do, beside :attr:`posting_volume`. A step may
    overrun its quota by one operation on the scores accumulated so far (a selection,
    a filter), linear in the documents matched at about 0.05 us each: a few
    milliseconds for a shard of 100,000 documents.
    """

    __slots__ = (
        "_acc",
        "_candidates",
        "_cursor",
        "_index",
        "_k",
        "_lists",
        "_lookups",
        "_open",
        "_order",
        "_phase",
        "_position",
        "_remaining",
        "_result",
        "_since_pruned",
        "_since_threshold",
        "_slack",
        "_terms",
        "_threshold",
        "_threshold_at",
        "_weights",
        "lookups",
        "postings_read",
        "work",
    )

    def __init__(self, index: InvertedIndex, query: str, k: int) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self._index = index
        self._lists = index.posting_lists
        self._k = k
        terms = index.term_ids(query) if k else []
        # In query order: the order the exhaustive search adds contributions in.
        self._terms = terms
        self._weights = [index.term_weight(t) for t in terms]
        bounds = [index.term_bound(t, w) for t, w in zip(terms, self._weights, strict=True)]
        # Decreasing bound: the rare, decisive terms first; ties in query order.
        order = sorted(range(len(terms)), key=lambda i: (-bounds[i], i))
        self._order = order
        # _remaining[j]: the sum of the bounds of the terms order[j:], still to read.
        remaining = [0.0] * (len(order) + 1)
        for j in range(len(order) - 1, -1, -1):
            remaining[j] = remaining[j + 1] + bounds[order[j]]
        self._remaining = remaining
        self._slack = _SLACK * remaining[0]
        self._acc: dict[int, float] = {}
        self._phase = _TERMS if terms else _DONE
        self._position = 0  # index in _order of the term being read
        self._cursor = 0  # next posting of that term (or next document of _lookups)
        self._lookups: list[int] | None = None  # documents looked up in that term
        self._open = True  # documents not seen yet may still enter the top k
        self._threshold = -math.inf  # a proven lower bound of the k-th best score
        self._threshold_at = remaining[0]  # the bounds still to read when it was taken
        self._since_threshold = 0
        self._since_pruned = 0
        self._candidates: list[int] = []
        self._result: list[Hit] | None = [] if not terms else None
        self.work = 0
        self.postings_read = 0
        self.lookups = 0

    @property
    def done(self) -> bool:
        """True once the search has run to its end (:meth:`hits` is then exact)."""
        return self._phase == _DONE

    @property
    def posting_volume(self) -> int:
        """The postings of the query's terms: what the exhaustive search reads."""
        offsets = self._lists.offsets
        return sum(offsets[t + 1] - offsets[t] for t in self._terms)

    def step(self, work: int) -> bool:
        """Do about ``work`` units of work (at least one operation); True when done."""
        quota = max(1, work)
        while quota > 0 and self._phase != _DONE:
            used = self._advance(quota) if self._phase == _TERMS else self._rescore(quota)
            quota -= used
            self.work += used
        return self._phase == _DONE

    def hits(self) -> list[Hit]:
        """The top ``k`` once done; before that the best found so far, by partial score."""
        if self._result is not None:
            return list(self._result)
        return self._index.top(self._acc, self._k)

    # -- reading terms -----------------------------------------------------------------

    def _advance(self, quota: int) -> int:
        """Read (part of) the current term; return the work used (at least 1)."""
        lists = self._lists
        term_index = self._order[self._position]
        term = self._terms[term_index]
        weight = self._weights[term_index]
        start, end = lists.offsets[term], lists.offsets[term + 1]
        acc = self._acc
        norms = lists.norms
        large_tfs = lists.large_tfs
        postings = lists.entries
        used = 0
        if (
            not self._open
            and self._cursor == 0
            and self._lookups is None
            and len(acc) * _LOOKUP_RATIO < end - start
        ):
            # Few documents left: find each in the postings rather than read them.
            self._lookups = list(acc)
            used += len(acc) // 4
        lookups = self._lookups
        if lookups is not None:
            chunk = lookups[self._cursor : self._cursor + max(1, quota // _LOOKUP_WORK)]
            for number in chunk:
                at = bisect_left(postings, number << _TF_BITS, start, end)
                if at < end:
                    entry = postings[at]
                    if entry >> _TF_BITS == number:
                        tf = entry & _TF_MASK
                        if tf == _TF_MASK:
                            tf = large_tfs[term, number]
                        acc[number] += weight * tf / (tf + norms[number])
            self._cursor += len(chunk)
            used += len(chunk) * _LOOKUP_WORK
            finished = self._cursor >= len(lookups)
            self.lookups += len(chunk)
            if finished:
                # The term counts as read: the amortized operations below may follow.
                self._since_threshold += end - start
                self._since_pruned += end - start
        else:
            first = start + self._cursor
            get = acc.get
            if self._open:
                last = min(end, first + quota)
                for entry in postings[first:last]:
                    number = entry >> _TF_BITS
                    tf = entry & _TF_MASK
                    if tf == _TF_MASK:
                        tf = large_tfs[term, number]
                    acc[number] = get(number, 0.0) + weight * tf / (tf + norms[number])
                used += last - first
            else:
                last = min(end, first + 2 * quota)
                for entry in postings[first:last]:
                    number = entry >> _TF_BITS
                    score = get(number)
                    if score is not None:
                        tf = entry & _TF_MASK
                        if tf == _TF_MASK:
                            tf = large_tfs[term, number]
                        acc[number] = score + weight * tf / (tf + norms[number])
                used += (last - first + 1) // 2
            self._cursor += last - first
            self.postings_read += last - first
            self._since_threshold += last - first
            self._since_pruned += last - first
            finished = last == end
        if finished:
            self._position += 1
            self._cursor = 0
            self._lookups = None
            if self._position == len(self._order):
                used += self._start_rescoring()
            else:
                used += self._between_terms()
        return max(1, used)

    def _between_terms(self) -> int:
        """After a term: raise the threshold, close the query, drop hopeless documents.

        Each operation on the accumulated scores is linear in their number, so it is
        done only when it can pay: the threshold is taken again only once as many
        postings have been read as there are scores and, while the query is open, only
        if it could by now have passed the bounds still to read (since it was last
        taken it has risen by at most the bounds read since); once closed, the hopeless
        documents are dropped once half as many postings have been read as there are
        documents left.
        """
        acc = self._acc
        k = self._k
        used = 0
        position = self._position
        remaining = self._remaining[position]
        if len(acc) >= k and self._since_threshold >= len(acc):
            if self._open:
                due = (
                    self._threshold == -math.inf
                    or remaining < self._threshold + self._threshold_at - remaining
                )
            else:
                due = True  # for a higher floor to drop documents at
            if due:
                self._since_threshold = 0
                self._threshold_at = remaining
                used += len(acc) // 4
                self._threshold = max(self._threshold, heapq.nlargest(k, acc.values())[-1])
        threshold = self._threshold - self._slack
        if self._open and remaining < threshold:
            self._open = False
            self._since_pruned = len(acc)
        if not self._open and self._since_pruned >= len(acc) // 2:
            self._since_pruned = 0
            floor = threshold - remaining
            self._acc = {n: s for n, s in acc.items() if s >= floor}
            used += len(acc) // 4
        return used

    def _exact_score(self, number: int) -> float:
        """The document's score as the exhaustive search sums it (query order)."""
        lists = self._lists
        offsets = lists.offsets
        postings = lists.entries
        large_tfs = lists.large_tfs
        norm = lists.norms[number]
        key = number << _TF_BITS
        score = 0.0
        for term, weight in zip(self._terms, self._weights, strict=True):
            start, end = offsets[term], offsets[term + 1]
            at = bisect_left(postings, key, start, end)
            if at < end:
                entry = postings[at]
                if entry >> _TF_BITS == number:
                    tf = entry & _TF_MASK
                    if tf == _TF_MASK:
                        tf = large_tfs[term, number]
                    score = score + weight * tf / (tf + norm)
        return score

    # -- the final candidates ----------------------------------------------------------

    def _start_rescoring(self) -> int:
        """All terms read: each document left has its whole score, summed in reading
        order. Find the candidates whose order could differ from the exhaustive
        search's, those within the slack of a neighbour: they are rescored in query
        order (the exhaustive search's own sums); any other two documents differ by
        far more than rounding, so their order is the same either way."""
        acc = self._acc
        k = self._k
        used = len(acc) // 4
        if self._order == sorted(self._order):
            # Read in query order: the sums are the exhaustive search's own.
            self._finish()
            return used
        if len(acc) > k:
            kth = heapq.nlargest(k, acc.values())[-1] - self._slack
            scores = {n: s for n, s in acc.items() if s >= kth}
        else:
            scores = dict(acc)
        self._acc = scores
        ranked = sorted(scores.items(), key=itemgetter(1), reverse=True)
        slack = self._slack
        close: set[int] = set()
        for (a, score_a), (b, score_b) in pairwise(ranked):
            if score_a - score_b <= slack:
                close.add(a)
                close.add(b)
        self._candidates = sorted(close)
        self._cursor = 0
        self._phase = _RESCORE
        return used + len(ranked) // 4

    def _rescore(self, quota: int) -> int:
        """Replace the close candidates' sums by their query-order ones."""
        per_document = max(1, len(self._terms) * _LOOKUP_WORK)
        chunk = self._candidates[self._cursor : self._cursor + max(1, quota // per_document)]
        acc = self._acc
        for number in chunk:
            acc[number] = self._exact_score(number)
        self._cursor += len(chunk)
        if self._cursor >= len(self._candidates):
            self._finish()
        return max(1, len(chunk) * per_document)

    def _finish(self) -> None:
        self._result = self._index.top(self._acc, self._k)
        self._phase = _DONE
        self._candidates = []
