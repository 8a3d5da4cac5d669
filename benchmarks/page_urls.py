"""The url table of a wiki-18-shaped corpus (every hit's ``url``, ``POST /access`` from the corpus): build rate, size,
and the time of one page lookup.

    python benchmarks/page_urls.py --rows 500000 --work_dir /tmp/page-urls

Writes (once, kept in --work_dir) a corpus of N rows shaped like wiki-18's (``{id, contents}``, a quoted title line,
~110 words, 8 passages per title), then builds the offsets and url tables from scratch and looks up 2,000 random
pages. Prints one JSON line; wiki-18's 21,015,324 rows scale the build time linearly (one pass).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.corpus_store import CorpusStore, offsets_path_for  # noqa: E402
from local_dense_retriever.page_urls import WIKI_BASE, CorpusPages, table_path_for  # noqa: E402

WIKI18_ROWS = 21_015_324
PER_TITLE = 8


def write_corpus(path: Path, rows: int) -> None:
    if path.is_file() and sum(1 for _ in path.open("rb")) == rows:
        return
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": str(i), "contents": f'"Article {i // PER_TITLE}"\n' + "word " * 110}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--work_dir", type=Path, default=Path("/tmp/page-urls"))
    p.add_argument("--lookups", type=int, default=2000)
    args = p.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    corpus_path = args.work_dir / "corpus.jsonl"
    write_corpus(corpus_path, args.rows)
    for stale in (offsets_path_for(corpus_path), table_path_for(corpus_path)):
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    corpus = CorpusStore(corpus_path, progress=False)
    offsets_s = time.perf_counter() - started
    started = time.perf_counter()
    pages = CorpusPages(corpus, progress=False)
    table_s = time.perf_counter() - started
    titles = args.rows // PER_TITLE
    urls = [f"{WIKI_BASE}Article_{random.Random(i).randrange(titles)}" for i in range(args.lookups)]
    started = time.perf_counter()
    found = sum(pages.get(url) is not None for url in urls)
    lookup_s = time.perf_counter() - started
    rate = args.rows / table_s
    print(
        json.dumps(
            {
                "rows": args.rows,
                "offsets_s": round(offsets_s, 2),
                "url_table_s": round(table_s, 2),
                "rows_per_s": round(rate),
                "table_mb": round(table_path_for(corpus_path).stat().st_size / 2**20, 1),
                "wiki18_estimate_s": round(WIKI18_ROWS / rate),
                "wiki18_table_mb": round((WIKI18_ROWS + 1) * 16 / 2**20),
                "page_lookup_ms": round(1000 * lookup_s / args.lookups, 3),
                "found": f"{found}/{args.lookups}",
            }
        )
    )


if __name__ == "__main__":
    main()
