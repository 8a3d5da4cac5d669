"""The durable cache of web answers, fetched pages and the budget ledger: one SQLite file in WAL mode, one connection
per process.

Keys: (provider, normalised query, k). A query is normalised by NFKC, casefolding, stripping and collapsing runs of
whitespace to one space; the provider is sent the normalised text, so a cached answer is exactly what a live call for
the key returned. An answer recorded for k' serves any k <= k' (its first k hits), and one that came back with fewer
hits than asked (the provider had no more) serves any k. Only answers are stored: errors never are, nor the key.

Durability: every write is one short transaction; WAL with ``synchronous=NORMAL`` never tears a row or the file when
the process is killed (a commit is in the WAL before it returns). Only an OS crash or power loss can roll back the
last commits, which costs a repeated live call, or a ledger a few calls short; FULL would fsync on every commit.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import unicodedata
from pathlib import Path

from local_dense_retriever.web.errors import WebSetupError
from local_dense_retriever.web.providers import WebHit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    provider TEXT NOT NULL,
    query TEXT NOT NULL,
    k INTEGER NOT NULL,
    hits TEXT NOT NULL,
    complete INTEGER NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (provider, query, k)
);
CREATE TABLE IF NOT EXISTS pages (
    url TEXT PRIMARY KEY,
    page TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    scope TEXT PRIMARY KEY,
    live_calls INTEGER NOT NULL,
    spend_usd REAL NOT NULL
);
"""


def normalize_query(text: str) -> str:
    """The cache key of a query: NFKC, casefolded, stripped, whitespace runs collapsed to one space."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class WebStore:
    """Cached answers and the per-run ledger in one SQLite file; safe to call from any thread of the process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._version = -1
            self._lock = threading.Lock()
            self._counts()
        except (OSError, sqlite3.Error) as e:
            raise WebSetupError(f"cannot open the web cache {path}: {e}") from None

    def _counts(self) -> tuple[int, int]:
        """(answers, pages) in the file. This process counts its own writes as it makes them; the tables are counted
        again only when another process sharing the file (a fleet's replica) has committed since the last count."""
        with self._lock:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._version:
                self._version = version
                self._rows = self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
                self._pages = self._db.execute("SELECT COUNT(*) FROM pages").fetchone()[0]
            return self._rows, self._pages

    def __len__(self) -> int:
        """Answers held (all providers), those other processes recorded in the file included."""
        return self._counts()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def get(self, provider: str, query: str, k: int) -> list[WebHit] | None:
        """The first ``k`` hits of a cached answer that covers ``k``, else None."""
        with self._lock:
            row = self._db.execute(
                "SELECT hits FROM answers WHERE provider = ? AND query = ? AND (k >= ? OR complete = 1) "
                "ORDER BY k LIMIT 1",
                (provider, query, k),
            ).fetchone()
        if row is None:
            return None
        return [WebHit(h["title"], h["url"], h["snippet"]) for h in json.loads(row[0])[:k]]

    def put(self, provider: str, query: str, k: int, hits: list[WebHit]) -> None:
        """Record the answer of a live call for top ``k`` (replacing an older one of the same key)."""
        payload = json.dumps([{"title": h.title, "url": h.url, "snippet": h.snippet} for h in hits], ensure_ascii=False)
        key = (provider, query, k)
        with self._lock:
            known = self._db.execute("SELECT 1 FROM answers WHERE provider = ? AND query = ? AND k = ?", key).fetchone()
            self._db.execute(
                "INSERT OR REPLACE INTO answers (provider, query, k, hits, complete, recorded_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (*key, payload, int(len(hits) < k), time.time()),
            )
            self._rows += known is None

    @property
    def pages(self) -> int:
        """Pages held, those other processes recorded in the file included."""
        return self._counts()[1]

    def get_page(self, url: str) -> dict | None:
        """The page recorded for ``url`` (as it was asked), else None."""
        with self._lock:
            row = self._db.execute("SELECT page FROM pages WHERE url = ?", (url,)).fetchone()
        return json.loads(row[0]) if row is not None else None

    def put_page(self, url: str, page: dict) -> None:
        """Record the page fetched for ``url`` (replacing an older one)."""
        payload = json.dumps(page, ensure_ascii=False)
        with self._lock:
            known = self._db.execute("SELECT 1 FROM pages WHERE url = ?", (url,)).fetchone()
            self._db.execute(
                "INSERT OR REPLACE INTO pages (url, page, recorded_at) VALUES (?, ?, ?)", (url, payload, time.time())
            )
            self._pages += known is None

    def ledger(self, scope: str) -> tuple[int, float]:
        """(live calls, spend in USD) recorded for the run ``scope``."""
        with self._lock:
            row = self._db.execute("SELECT live_calls, spend_usd FROM ledger WHERE scope = ?", (scope,)).fetchone()
        return (int(row[0]), float(row[1])) if row else (0, 0.0)

    def reserve(
        self, scope: str, cost: float, max_calls: int | None, max_spend: float | None
    ) -> tuple[bool, int, float]:
        """Count one live call of ``cost`` for ``scope`` if it stays within both ceilings, atomically across
        processes sharing the file: (granted, live calls, spend) after the attempt."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # the ledger row is read and written under one write lock
            try:
                self._db.execute(
                    "INSERT OR IGNORE INTO ledger (scope, live_calls, spend_usd) VALUES (?, 0, 0)", (scope,)
                )
                calls, spend = self._db.execute(
                    "SELECT live_calls, spend_usd FROM ledger WHERE scope = ?", (scope,)
                ).fetchone()
                granted = (max_calls is None or calls < max_calls) and (
                    max_spend is None or spend + cost <= max_spend + 1e-9
                )
                if granted:
                    calls, spend = calls + 1, spend + cost
                    self._db.execute(
                        "UPDATE ledger SET live_calls = ?, spend_usd = ? WHERE scope = ?", (calls, spend, scope)
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return granted, int(calls), float(spend)

    def refund(self, scope: str, cost: float) -> tuple[int, float]:
        """Take back a reserved call the provider refused with an error status (not billed): the ledger after."""
        with self._lock:
            self._db.execute(
                "UPDATE ledger SET live_calls = MAX(live_calls - 1, 0), spend_usd = MAX(spend_usd - ?, 0) "
                "WHERE scope = ?",
                (cost, scope),
            )
            row = self._db.execute("SELECT live_calls, spend_usd FROM ledger WHERE scope = ?", (scope,)).fetchone()
        return (int(row[0]), float(row[1])) if row else (0, 0.0)
