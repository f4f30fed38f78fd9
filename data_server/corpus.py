"""Documents of one shard: generated deterministically, or loaded from a JSONL file.

Generated shards draw Zipf-distributed words only from explicitly seeded
:class:`random.Random` instances, so a shard is the same in every process and run.

Design: docs/design/data-server.md, "The data server".
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

__all__ = [
    "MAX_DOC_TOKENS",
    "MIN_DOC_TOKENS",
    "VOCABULARY_SIZE",
    "ZIPF_EXPONENT",
    "Document",
    "generate_documents",
    "load_jsonl",
    "sample_queries",
    "vocabulary",
]

VOCABULARY_SIZE = 30_000
# Natural-language corpora measure s ~ 1.0 at the head and slightly more in the tail.
ZIPF_EXPONENT = 1.05

MIN_DOC_TOKENS = 30
MAX_DOC_TOKENS = 300
# Log-normal lengths (median ~120 tokens) give the long right tail real collections have.
_LENGTH_MEDIAN = 120.0
_LENGTH_SIGMA = 0.6

# The most frequent ranks behave like stop words: kept out of titles and queries.
_FUNCTION_WORDS = 100
# Queries draw from this rank window: frequent enough to hit a few documents of a small
# shard, rare enough not to match most of it.
_QUERY_MIN_RANK = 50
_QUERY_MAX_RANK = 10_000

# Syllable parts, repeated to weight them: simple consonant-vowel syllables dominate, as
# in most languages, with clusters, diphthongs and closing consonants less common.
_ONSETS = (
    *("", "", "", "", "b", "b", "c", "d", "d", "f", "g", "h", "k", "l", "l", "m", "m", "n"),
    *("n", "p", "r", "r", "s", "s", "t", "t", "v", "w", "z", "br", "tr", "st", "sh", "ch"),
    *("th", "pl", "gr"),
)
_NUCLEI = ("a", "a", "e", "e", "e", "i", "i", "o", "o", "u", "ai", "ea", "ee", "oo", "ou")
_CODAS = (
    *("", "", "", "", "", "", "", "", "", "n", "n", "r", "r", "s", "t", "l", "m", "d"),
    *("k", "ng", "nd", "st"),
)

# Ranks are drawn by looking up a uniform 32-bit number in a table of 2**21 slots, each
# rank owning a share of slots proportional to its Zipf weight. This is several times
# faster than random.choices (one bisect per draw) and even the rarest rank keeps a few
# slots, so its frequency is off by well under a third.
_TABLE_BITS = 21
_SHIFT = 32 - _TABLE_BITS


@dataclass(frozen=True, slots=True)
class Document:
    """One document of a shard: a unique ``id``, a short ``title`` and the body ``text``."""

    id: str
    title: str
    text: str


@lru_cache(maxsize=8)
def vocabulary(seed: int = 0) -> tuple[str, ...]:
    """The synthetic vocabulary for ``seed``, most frequent word first (rank 0).

    Words are built from syllables; like real words, frequent ones tend to be short
    (Zipf's law of abbreviation). Cached per process, so the simulated servers of a
    fleet share one copy; the words are interned, so the term strings of their indexes
    (which are interned too) are these same objects.
    """
    rng = random.Random(f"vocabulary:{seed}")
    words: list[str] = []
    seen: set[str] = set()
    for rank in range(VOCABULARY_SIZE):
        mean_syllables = 1.0 + 0.4 * math.log10(rank + 1)
        while True:
            syllables = min(4, max(1, round(rng.gauss(mean_syllables, 0.5))))
            word = "".join(
                rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
                for _ in range(syllables)
            )
            if len(word) > 1 and word not in seen:
                break
        seen.add(word)
        words.append(sys.intern(word))
    return tuple(words)


@lru_cache(maxsize=1)
def _cumulative_weights() -> tuple[float, ...]:
    """Cumulative Zipf weights over the ranks (index 0 is rank 0), for bisection."""
    return tuple(accumulate(1.0 / (rank**ZIPF_EXPONENT) for rank in range(1, VOCABULARY_SIZE + 1)))


@lru_cache(maxsize=1)
def _rank_table() -> array[int]:
    """Slot -> rank lookup table for fast Zipf draws (see ``_TABLE_BITS``)."""
    cum_weights = _cumulative_weights()
    slots = 1 << _TABLE_BITS
    scale = slots / cum_weights[-1]
    table: array[int] = array("H")
    boundary = 0
    for rank, weight in enumerate(cum_weights):
        # Rounding cumulative boundaries keeps the total exact and every rank within
        # one slot of its true share.
        end = min(slots, round(weight * scale))
        table.extend(array("H", (rank,)) * max(1, end - boundary))
        boundary = len(table)
    del table[slots:]
    return table


def _draw_slots(rng: random.Random, count: int) -> array[int]:
    """Draw ``count`` uniform 32-bit numbers, reproducibly on any platform.

    ``_rank_table()[value >> _SHIFT]`` turns one into a Zipf-distributed rank.
    """
    raw = array("I", rng.randbytes(4 * count))
    if sys.byteorder == "big":
        raw.byteswap()
    return raw


def _shard_rng(kind: str, seed: int, shard: int) -> random.Random:
    # String seeds are hashed with SHA-512 by random.seed, so they are stable across
    # processes regardless of PYTHONHASHSEED.
    return random.Random(f"{kind}:{seed}:{shard}")


def generate_documents(count: int, *, shard: int, seed: int = 0) -> list[Document]:
    """Generate ``count`` documents for ``shard`` with ids ``s{shard}-{n}``.

    The result depends only on the arguments. Document ``n`` does not depend on
    ``count``, so a larger shard extends a smaller one. Body text is made of sentences
    of Zipf-distributed words (30-300 tokens); the title is a few of the document's own
    content words. Raises ``ValueError`` if ``count`` or ``shard`` is negative.
    """
    if count < 0:
        raise ValueError(f"document count must be >= 0, got {count}")
    if shard < 0:
        raise ValueError(f"shard must be >= 0, got {shard}")
    words = vocabulary(seed)
    table = _rank_table()
    rng = _shard_rng("documents", seed, shard)
    uniform = rng.random
    log_median = math.log(_LENGTH_MEDIAN)
    documents: list[Document] = []
    for n in range(count):
        length = round(rng.lognormvariate(log_median, _LENGTH_SIGMA))
        length = min(MAX_DOC_TOKENS, max(MIN_DOC_TOKENS, length))
        slots = _draw_slots(rng, length)
        tokens = [words[table[value >> _SHIFT]] for value in slots]
        title = _title(slots, table, words, uniform)
        # Punctuate in place and join once: sentences of 5-18 words.
        start = 0
        while start < length:
            tokens[start] = tokens[start].capitalize()
            start += 5 + int(uniform() * 14)
            tokens[min(start, length) - 1] += "."
        documents.append(Document(id=f"s{shard}-{n}", title=title, text=" ".join(tokens)))
    return documents


def _title(
    slots: array[int], table: array[int], words: tuple[str, ...], uniform: Callable[[], float]
) -> str:
    """Pick 2-6 distinct content words of a document (falling back to its first word)."""
    wanted = 2 + int(uniform() * 5)
    picked: list[int] = []
    # Bounded attempts: a short document may have fewer distinct content words.
    for _ in range(4 * wanted):
        rank = table[slots[int(uniform() * len(slots))] >> _SHIFT]
        if rank >= _FUNCTION_WORDS and rank not in picked:
            picked.append(rank)
            if len(picked) == wanted:
                break
    if not picked:
        picked.append(table[slots[0] >> _SHIFT])
    return " ".join(words[rank].capitalize() for rank in picked)


def sample_queries(count: int, *, seed: int = 0, variant: int = 0) -> list[str]:
    """Return ``count`` realistic 1-3 word queries for documents generated with ``seed``.

    Words are drawn from the same Zipf distribution as the documents, restricted to
    mid-frequency ranks (no stop words, no words so rare they hit nothing), and are
    distinct within a query. ``variant`` selects another deterministic set of queries
    over the same vocabulary. Raises ``ValueError`` if ``count`` is negative.
    """
    if count < 0:
        raise ValueError(f"query count must be >= 0, got {count}")
    words = vocabulary(seed)
    cum_weights = _cumulative_weights()
    low = cum_weights[_QUERY_MIN_RANK - 1]
    high = cum_weights[_QUERY_MAX_RANK - 1]
    rng = random.Random(f"queries:{seed}:{variant}")
    queries: list[str] = []
    for _ in range(count):
        size = rng.choices((1, 2, 3), weights=(0.45, 0.35, 0.20))[0]
        picked: list[str] = []
        while len(picked) < size:
            word = words[bisect_right(cum_weights, rng.uniform(low, high))]
            if word not in picked:
                picked.append(word)
        queries.append(" ".join(picked))
    return queries


def _parse_line(line: str, where: str) -> Document:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    doc_id = record.get("id")
    if not isinstance(doc_id, str) or not doc_id:
        raise ValueError(f"{where}: 'id' must be a non-empty string")
    text = record.get("text")
    if not isinstance(text, str):
        raise ValueError(f"{where}: 'text' must be a string")
    title = record.get("title", "")
    if title is None:
        title = ""
    if not isinstance(title, str):
        raise ValueError(f"{where}: 'title' must be a string when present")
    return Document(id=doc_id, title=title, text=text)


def load_jsonl(path: str | os.PathLike[str]) -> list[Document]:
    """Load documents from a JSONL file: one object per line, blank lines skipped.

    Each object needs ``id`` (non-empty string) and ``text`` (string); ``title``
    (string) is optional and other fields are ignored. A line that is not valid UTF-8
    or JSON, lacks a field, or repeats an earlier id raises ``ValueError`` naming the
    file and the 1-based line number. ``OSError`` from opening or reading propagates.
    """
    documents: list[Document] = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, start=1):
            where = f"{os.fsdecode(path)}, line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not valid UTF-8 ({exc.reason})") from None
            if not line.strip():
                continue
            document = _parse_line(line, where)
            previous = first_line.setdefault(document.id, number)
            if previous != number:
                raise ValueError(
                    f"{where}: duplicate id {document.id!r} (first on line {previous})"
                )
            documents.append(document)
    return documents
