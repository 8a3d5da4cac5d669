"""The pages world: search snippets name an entity and its url but none of the answers its questions ask; the page at
that url holds them; the files are deterministic and reused."""

from __future__ import annotations

import json

from local_dense_retriever.pages import PageStore
from local_dense_retriever.toy.pages_world import generate_pages_world
from local_dense_retriever.toy.questions import generate_questions
from local_dense_retriever.toy.world import ToyWorld


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_snippets_leave_out_every_answer_and_their_page_holds_it(tmp_path):
    world = ToyWorld(200, 3)
    dataset = generate_pages_world(tmp_path / "w", 200, seed=3)
    snippets = {row["id"]: row for row in _lines(dataset.corpus_path)}
    pages = PageStore(dataset.pages_path, progress=False)
    single = [q for q in generate_questions(world, 20) if q["metadata"]["hops"] == 1]
    assert single
    for question in single:
        row = snippets[question["metadata"]["supporting_ids"][0]]
        assert world.name[int(row["id"])] in row["contents"]  # the entity is named, so a search finds it
        body = row["contents"].split("\n", 1)[1]
        assert not any(answer.lower() in body.lower() for answer in question["golden_answers"]), (question, body)
        page = pages.get(row["url"])
        assert page is not None and page["title"] == world.name[int(row["id"])]
        assert any(answer in page["contents"] for answer in question["golden_answers"])
        assert len(page["contents"]) < 900  # one window of the access tool (1,000 characters)


def test_the_world_is_deterministic_and_a_complete_folder_is_reused(tmp_path):
    first = generate_pages_world(tmp_path / "a", 120, seed=1)
    second = generate_pages_world(tmp_path / "b", 120, seed=1)
    for name in ("corpus_path", "pages_path"):
        assert getattr(first, name).read_bytes() == getattr(second, name).read_bytes()
    stamp = first.pages_path.stat().st_mtime_ns
    generate_pages_world(tmp_path / "a", 120, seed=1)
    assert first.pages_path.stat().st_mtime_ns == stamp  # reused, not rewritten
    assert generate_pages_world(tmp_path / "a", 120, seed=2).pages_path.read_bytes() != second.pages_path.read_bytes()
