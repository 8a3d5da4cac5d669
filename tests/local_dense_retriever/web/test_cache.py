"""The durable cache: its key (normalised query, provider, k), its modes, single-flight of identical queries, that
errors are never kept, and that answers survive a restart and a SIGKILL mid-write whole."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from local_dense_retriever.web.cache import WebStore, normalize_query
from local_dense_retriever.web.errors import NotCached, UpstreamError
from local_dense_retriever.web.providers import WebHit

REPO = Path(__file__).resolve().parents[3]


def test_queries_differing_in_case_width_and_spacing_share_one_key():
    assert normalize_query("  Ｐａｒｉｓ\t\n CAPITAL ") == "paris capital"
    assert normalize_query("Straße") == normalize_query("STRASSE")


def test_a_second_spelling_of_a_query_is_answered_from_the_cache(provider, web_backend):
    backend = web_backend()
    first = backend.search(["Capital of France"], 3)
    second = backend.search(["  capital   OF france"], 3)
    assert first == second and len(provider.requests) == 1
    assert backend.stats()["cache_hits_total"] == 1 and backend.stats()["cache_hit_rate"] == 0.5


def test_an_answer_for_a_larger_k_serves_a_smaller_k_exactly(provider, web_backend):
    backend = web_backend()
    [five] = backend.search(["danube"], 5)
    [three] = backend.search(["danube"], 3)
    assert three == five[:3] and len(provider.requests) == 1
    backend.search(["danube"], 8)  # more than was recorded: a live call
    assert len(provider.requests) == 2 and provider.requests[-1]["json"]["num"] == 8


def test_an_answer_shorter_than_asked_serves_any_k(provider, web_backend, fault):
    provider.plan.append(fault(raw=b'{"organic": [{"title": "only", "link": "https://only.example"}]}'))
    backend = web_backend()
    assert len(backend.search(["rare"], 3)[0]) == 1
    assert len(backend.search(["rare"], 10)[0]) == 1 and len(provider.requests) == 1


def test_answers_survive_a_restart_and_replay_needs_no_key(provider, web_backend, monkeypatch):
    recorded = web_backend().search(["marie curie", "warsaw"], 2)
    monkeypatch.delenv("SERPER_API_KEY")
    replay = web_backend(web_cache_mode="replay")
    assert replay.search(["Marie Curie", "warsaw"], 2) == recorded
    assert len(provider.requests) == 2


def test_replay_answers_a_miss_as_not_cached_and_never_calls(provider, web_backend):
    web_backend().search(["known"], 2)
    provider.requests.clear()
    backend = web_backend(web_cache_mode="replay")
    known, unknown, larger = backend.search(["known", "unknown"], 2) + backend.search(["known"], 5)
    assert len(known) == 2
    assert isinstance(unknown, NotCached) and "'unknown' has no cached serper answer" in str(unknown)
    assert isinstance(larger, NotCached)  # a top 5 cannot be made from a recorded top 2
    assert provider.requests == [] and backend.stats()["replay_misses_total"] == 2


def test_live_mode_always_calls_and_records(provider, web_backend):
    backend = web_backend(web_cache_mode="live")
    backend.search(["fresh"], 2)
    backend.search(["fresh"], 2)
    assert len(provider.requests) == 2 and backend.stats()["cache_hits_total"] == 0
    assert len(web_backend(web_cache_mode="replay").search(["fresh"], 2)[0]) == 2


def test_a_failed_call_is_never_cached(provider, web_backend, fault):
    provider.plan.append(fault(status=401, message="bad key"))
    backend = web_backend()
    [failed] = backend.search(["retry me"], 2)
    assert isinstance(failed, UpstreamError) and len(backend) == 0
    [answered] = backend.search(["retry me"], 2)
    assert len(answered) == 2 and len(provider.requests) == 2


def test_identical_queries_in_flight_share_one_live_call(provider, web_backend):
    backend = web_backend()
    # one batch: two spellings of the same query
    first, second = backend.search(["Twin", " twin "], 2)
    assert first == second and len(provider.requests) == 1
    # two threads (the per-request mode): the second asks while the first's call is held at the provider
    provider.gate = threading.Event()
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(backend.search(["held query"], 2))) for _ in range(2)]
    threads[0].start()
    while len(provider.requests) < 2:
        time.sleep(0.01)
    threads[1].start()
    while backend.joined < 2:
        time.sleep(0.01)
    provider.gate.set()
    for t in threads:
        t.join(10)
    assert len(answers) == 2 and answers[0] == answers[1] and len(provider.requests) == 2


_WRITER = """
import sys
from pathlib import Path
from local_dense_retriever.web.cache import WebStore
from local_dense_retriever.web.providers import WebHit

store = WebStore(Path(sys.argv[1]))
for i in range(1_000_000):
    hits = [WebHit(f"title {i}.{j}", f"https://e.example/{i}/{j}", f"snippet {i}.{j} " + "x" * 400) for j in range(5)]
    store.put("serper", f"query {i}", 5, hits)
    granted, calls, spend = store.reserve("run", 0.001, None, None)
    print(i, flush=True)
"""


def expected(i: int) -> list[WebHit]:
    return [WebHit(f"title {i}.{j}", f"https://e.example/{i}/{j}", f"snippet {i}.{j} " + "x" * 400) for j in range(5)]


def test_a_writer_killed_mid_write_leaves_every_committed_answer_whole(tmp_path):
    path = tmp_path / "killed.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    committed = -1
    while committed < 400:
        line = proc.stdout.readline()
        assert line, "the writer ended early"
        committed = int(line)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = db.execute("SELECT query FROM answers").fetchall()
    store = WebStore(path)
    try:
        for i in range(committed + 1):
            assert store.get("serper", f"query {i}", 5) == expected(i)
        for (query,) in rows:  # any row written after the last line printed is whole too
            i = int(query.split()[1])
            assert store.get("serper", query, 5) == expected(i)
        calls, spend = store.ledger("run")
        assert calls >= committed + 1 and spend == pytest.approx(calls * 0.001)
    finally:
        store.close()


def test_a_cache_file_from_before_pages_opens_and_keeps_its_answers_and_pages_across_a_restart(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)  # the file as servers wrote it before /access pages were cached
    db.execute(
        "CREATE TABLE answers (provider TEXT NOT NULL, query TEXT NOT NULL, k INTEGER NOT NULL, hits TEXT "
        "NOT NULL, complete INTEGER NOT NULL, recorded_at REAL NOT NULL, PRIMARY KEY (provider, query, k))"
    )
    db.execute("INSERT INTO answers VALUES ('serper', 'paris', 1, ?, 0, 0)",
               ('[{"title": "Paris", "url": "https://p.example/", "snippet": "Capital."}]',))  # fmt: skip
    db.commit()
    db.close()
    store = WebStore(path)
    assert store.get("serper", "paris", 1) == [WebHit("Paris", "https://p.example/", "Capital.")]
    page = {"url": "https://p.example/?a=1", "title": "Paris \u00e9t\u00e9", "contents": "Capital.", "truncated": False}
    assert store.pages == 0 and store.get_page(page["url"]) is None
    store.put_page(page["url"], page)
    store.put_page(page["url"], page)  # recorded again (live mode): one page
    store.close()
    reopened = WebStore(path)
    assert reopened.pages == 1 and reopened.get_page(page["url"]) == page
    assert reopened.get_page("https://p.example/?a=2") is None  # keyed by the url exactly as asked
    reopened.close()


def test_a_store_counts_the_answers_and_pages_other_processes_sharing_its_file_recorded(tmp_path):
    """Replicas of a fleet share one file: each one's count (in /health and /metrics) is the file's, not its own."""
    path = tmp_path / "shared.sqlite3"
    mine, other = WebStore(path), WebStore(path)  # two connections, as two processes have
    hit = [WebHit("t", "https://example.org/a", "s")]
    mine.put("serper", "alpha", 1, hit)
    other.put("serper", "beta", 1, hit)
    other.put("serper", "alpha", 1, hit)  # the same key again: still one answer
    other.put_page("https://example.org/a", {"url": "https://example.org/a", "contents": "a"})
    mine.put("serper", "gamma", 1, hit)
    assert (len(mine), mine.pages) == (len(other), other.pages) == (3, 1)
    mine.close()
    other.close()
