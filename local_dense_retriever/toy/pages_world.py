"""The pages world: the toy world split into search snippets that name an entity and its url but never a fact about
it, and a page per url holding the entity's whole passage; served by the retriever with ``--pages_path``.

Invariant: the files are a pure function of (num_passages, seed) and written atomically, the manifest last (a folder
with a matching manifest is complete and reused); no snippet holds any answer of the single-hop questions, which the
page at its url always holds (the passage of ``ToyWorld``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from local_dense_retriever.pages import url_of
from local_dense_retriever.toy.world import CITY, MOUNTAIN, ORG, PERSON, RIVER, ToyWorld
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

CORPUS_FILE, PAGES_FILE, INDEX_FILE, MANIFEST_FILE = "snippets.jsonl", "pages.jsonl", "minilm_flat.npy", "pages.json"
#: bump when the generated text changes, so stale folders are rebuilt
FORMAT_VERSION = 1
#: what a snippet says of each kind of entity: nothing a question asks (birth, year, profession, river, country,
#: founder), only that the page tells it
_SNIPPETS = {
    PERSON: "{name} is a person. The page of {name} tells where and when they were born and what they did.",
    CITY: "{name} is a city. The page of {name} tells its country, its river and its history.",
    RIVER: "The {name} is a river. Its page tells where it rises and where it flows.",
    ORG: "The {name} is an organisation. Its page tells who founded it and where it is based.",
    MOUNTAIN: "{name} is a mountain. Its page tells its range, its height and who first climbed it.",
}


@dataclass(frozen=True)
class PagesDataset:
    """A generated pages world on disk: the snippet corpus the retriever searches and the pages it opens."""

    out_dir: Path
    corpus_path: Path
    pages_path: Path
    num_passages: int
    seed: int

    @property
    def index_path(self) -> Path:
        return self.out_dir / INDEX_FILE


def page_url(world: ToyWorld, row: int) -> str:
    """The url of row ``row``'s page: the Wikipedia link of its title (the retriever's rule for a corpus row)."""
    return url_of({"title": world.name[row]})


def snippet(world: ToyWorld, row: int) -> dict:
    """The corpus row the retriever finds for entity ``row``: its title, url and a sentence without its facts."""
    text = _SNIPPETS[world.kind[row]].format(name=world.name[row])
    return {"id": str(row), "contents": f'"{world.name[row]}"\n{text}', "url": page_url(world, row)}


def page(world: ToyWorld, row: int) -> dict:
    """The page at entity ``row``'s url: its whole passage (a few hundred characters: one window of access)."""
    title, _, text = world.passage(row).partition("\n")
    return {"url": page_url(world, row), "title": title.strip('"'), "contents": text}


def _write_jsonl(path: Path, rows) -> int:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return path.stat().st_size


def _manifest(num_passages: int, seed: int) -> dict:
    return {"format_version": FORMAT_VERSION, "num_passages": num_passages, "seed": seed}


def _complete(out_dir: Path, wanted: dict) -> bool:
    try:
        found = json.loads((out_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
        sizes = {name: (out_dir / name).stat().st_size for name in (CORPUS_FILE, PAGES_FILE)}
    except (OSError, ValueError):
        return False
    return {k: found.get(k) for k in wanted} == wanted and found.get("bytes") == sizes


def generate_pages_world(out_dir: Path, num_passages: int = 2000, seed: int = 0) -> PagesDataset:
    """Write (or reuse) ``out_dir/snippets.jsonl`` and ``out_dir/pages.jsonl`` of the toy world (``num_passages``,
    ``seed``); raises ValueError for sizes the world cannot have."""
    out_dir = Path(out_dir)
    dataset = PagesDataset(out_dir, out_dir / CORPUS_FILE, out_dir / PAGES_FILE, num_passages, seed)
    wanted = _manifest(num_passages, seed)
    if _complete(out_dir, wanted):
        return dataset
    world = ToyWorld(num_passages, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)  # incomplete until the manifest is back
    rows = range(num_passages)
    sizes = {
        CORPUS_FILE: _write_jsonl(dataset.corpus_path, (snippet(world, r) for r in rows)),
        PAGES_FILE: _write_jsonl(dataset.pages_path, (page(world, r) for r in rows)),
    }
    with atomic_path(out_dir / MANIFEST_FILE) as tmp:
        tmp.write_text(json.dumps({**wanted, "bytes": sizes}, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote the pages world (%d snippets and pages) to %s", num_passages, out_dir)
    return dataset


def build_pages_index(dataset: PagesDataset, *, progress: bool = False) -> Path:
    """The snippets' MiniLM flat index (the embedded default's encoder), built once beside them: a sidecar names the
    manifest it was encoded from, so a regenerated world never meets a stale index."""
    from local_dense_retriever.artifacts.build_index import build_flat_index
    from local_dense_retriever.encoder import HFEncoder
    from local_dense_retriever.toy.embedded_default import MINILM_NAME, bundled_minilm_path

    source_path = dataset.index_path.with_name(INDEX_FILE + ".source.json")
    source = (dataset.out_dir / MANIFEST_FILE).read_text(encoding="utf-8")
    if dataset.index_path.is_file() and source_path.is_file() and source_path.read_text(encoding="utf-8") == source:
        return dataset.index_path
    model = bundled_minilm_path()
    encoder = HFEncoder(model, retriever_name=MINILM_NAME, pooling="mean", device="cpu", dtype="float32")
    build_flat_index(dataset.corpus_path, [dataset.index_path], encoder, model_id=str(model), progress=progress)
    with atomic_path(source_path) as tmp:
        tmp.write_text(source, encoding="utf-8")
    return dataset.index_path


def server_flags(dataset: PagesDataset) -> list[str]:
    """The retrieval server's flags that serve ``dataset`` (its index built first): snippets searched, pages opened."""
    from local_dense_retriever.toy.embedded_default import MINILM_NAME, bundled_minilm_path

    index = build_pages_index(dataset)
    return [
        "--index_path", str(index), "--corpus_path", str(dataset.corpus_path), "--pages_path",
        str(dataset.pages_path), "--retriever_name", MINILM_NAME, "--retriever_model", str(bundled_minilm_path()),
    ]  # fmt: skip
