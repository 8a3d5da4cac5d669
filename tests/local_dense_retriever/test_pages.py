"""Every hit carries a url and POST /access answers for it, on a wiki-18-shaped corpus (``{id, contents}``, title as
the first line) as ASearcher's and RLinf's clients use them: read ``url`` from each hit, then fetch its page."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.pages import CorpusPages, table_path_for, text_of, title_of, url_of

WIKI = "https://en.wikipedia.org/wiki/"
ROWS = [
    {"id": "0", "contents": '"Badger"\nBadgers dig setts.'},
    {"id": "1", "contents": '"Aardvark"\nAardvarks eat termites.'},
    {"id": "2", "contents": '"Badger"\nBadgers are mustelids.'},
    {"id": "3", "contents": '"Marie Curie"\nMarie Curie studied radioactivity.'},
    {"id": "4", "contents": '"AC/DC (band)"\nAC/DC formed in Sydney.'},
    {"id": "5", "contents": "Own link\nA passage that brings its url.", "url": "https://example.org/own"},
]


@pytest.fixture
def wiki_corpus(tmp_path):
    path = tmp_path / "wiki-18.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


@pytest.mark.parametrize(
    ("row", "title", "url", "text"),
    [
        (ROWS[3], "Marie Curie", WIKI + "Marie_Curie", "Marie Curie studied radioactivity."),
        (ROWS[4], "AC/DC (band)", WIKI + "AC/DC_(band)", "AC/DC formed in Sydney."),
        ({"contents": '"Café Ñ & co?"\nx'}, "Café Ñ & co?", WIKI + "Caf%C3%A9_%C3%91_&_co%3F", "x"),
        ({"contents": "T\nbody", "title": "T", "url": "https://x.org/T"}, "T", "https://x.org/T", "body"),
        ({"contents": "no title line", "title": "Named"}, "Named", WIKI + "Named", "no title line"),
    ],
)
def test_the_documented_rule_for_titles_urls_and_texts(row, title, url, text):
    assert (title_of(row), url_of(row), text_of(row)) == (title, url, text)


def test_a_url_gives_its_rows_joined_in_corpus_order_and_the_table_is_kept(wiki_corpus):
    corpus = CorpusStore(wiki_corpus, progress=False)
    pages = CorpusPages(corpus, progress=False)
    assert pages.get(WIKI + "Badger") == {
        "url": WIKI + "Badger",
        "title": "Badger",
        "contents": "Badgers dig setts.\n\nBadgers are mustelids.",
    }
    own = pages.get("https://example.org/own")  # its own url; title and text by the same rule
    assert (own["title"], own["contents"]) == ("Own link", "A passage that brings its url.")
    assert pages.get(WIKI + "Nothing") is None and pages.get("") is None
    table = table_path_for(wiki_corpus)
    built = table.stat().st_mtime_ns
    assert CorpusPages(corpus, progress=False).get(WIKI + "Aardvark")["title"] == "Aardvark"
    assert table.stat().st_mtime_ns == built  # reused, not rebuilt


def test_a_changed_corpus_rebuilds_the_table(wiki_corpus):
    CorpusPages(CorpusStore(wiki_corpus, progress=False), progress=False)
    with open(wiki_corpus, "a") as f:
        f.write(json.dumps({"id": "6", "contents": '"Badger"\nA third badger passage.'}) + "\n")
    os.utime(wiki_corpus)
    pages = CorpusPages(CorpusStore(wiki_corpus, progress=False), progress=False)
    assert pages.get(WIKI + "Badger")["contents"].endswith("A third badger passage.")


def test_asearcher_flow_every_hit_has_a_url_whose_page_access_returns(wiki_corpus, make_hash_engine):
    """What ASearcher's client does: search, read each hit's url, fetch the pages; a pages file still wins."""
    engine = make_hash_engine(wiki_corpus)
    with BackgroundServer(create_app(ServerConfig(), engine=engine)) as srv:
        queries = ["badgers dig", "marie curie radioactivity", "url passage"]
        body = {"queries": queries, "topk": 2, "return_scores": True}
        result = httpx.post(f"{srv.url}/retrieve", json=body).json()["result"]
        hits = [hit["document"] for per_query in result for hit in per_query]
        assert all(hit["url"] == url_of(ROWS[int(hit["id"])]) for hit in hits)
        urls = sorted({hit["url"] for hit in hits})
        pages = httpx.post(f"{srv.url}/access", json={"urls": [*urls, WIKI + "Nothing"]}).json()["result"]
        assert pages[-1] is None
        for url, page in zip(urls, pages, strict=False):
            assert page["url"] == url and page["contents"]
        badger = httpx.post(f"{srv.url}/access", json={"urls": [WIKI + "Badger"]}).json()["result"][0]
        assert badger["contents"] == "Badgers dig setts.\n\nBadgers are mustelids."
