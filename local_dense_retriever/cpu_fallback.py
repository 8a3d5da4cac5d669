"""The flat index on GPUs, or a compressed one on the CPU: when the memory plan of a flat index on GPUs takes more of
a GPU than --gpu_memory_fraction, the server serves --cpu_index (a file, or the best one ``auto`` finds beside the
flat index) on the CPU instead, or warns and recommends building one. Invariant: ``decide`` is arithmetic over the
plan's shares (any devices); the rest reads build records and never loads an index."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.build_record import BuildRecord, read_record, record_path
from local_dense_retriever.index.index_info import stored_recall
from local_dense_retriever.load_progress import format_bytes
from local_dense_retriever.memory_plan import Plan, Share

logger = logging.getLogger(__name__)

#: the compressed index the warning recommends building (build_index.py --index_type)
RECOMMENDED_TYPE = "ivf_sq8"


@dataclass(frozen=True)
class Fallback:
    """A compressed index of the flat one's corpus: its file, build record (None: none) and stored recall."""

    path: Path
    record: BuildRecord | None
    recall: float | None
    recall_note: str


@dataclass(frozen=True)
class Decision:
    """Serve ``fallback`` on the CPU (None: the flat index as planned), and the lines that say why."""

    fallback: Fallback | None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def gpu_overflow(shares: Sequence[Share], fraction: float) -> Share | None:
    """The GPU share that takes the most of its GPU's memory, if that is over ``fraction``; None when every GPU's
    share fits (or there is no GPU, or its memory is not known)."""
    gpus = [s for s in shares if s.device.name.startswith("cuda") and s.device.total_bytes]
    worst = max(gpus, key=lambda s: s.held_bytes / s.device.total_bytes, default=None)
    return worst if worst is not None and worst.held_bytes > fraction * worst.device.total_bytes else None


def recommendation(flat: Path) -> str:
    """How to build a compressed index from the flat one and serve it on the CPU."""
    out = flat.with_name(f"{flat.stem}_{RECOMMENDED_TYPE}.index")
    build = f"python local_dense_retriever/build_index.py --from_index {flat} --index_type {RECOMMENDED_TYPE}"
    serve = f"GPUS=none INDEX_PATH={out} bash run_scripts/launch_retriever.sh"
    return (f"build a compressed index from the flat one with `{build} --output {out}` and serve it on the CPU "
            f"(`{serve}`), or pass --cpu_index {out}")  # fmt: skip


def decide(
    shares: Sequence[Share], fraction: float, flat: Path, fallback: Fallback | None, asked: str | None
) -> Decision:
    """Whether to serve the flat index ``flat`` as ``shares`` plan it, or ``fallback`` (what ``asked``, the
    --cpu_index given, resolved to) on the CPU."""
    over = gpu_overflow(shares, fraction)
    if over is None:
        gpus = [s for s in shares if s.device.name.startswith("cuda") and s.device.total_bytes]
        if not asked:
            return Decision(None)
        if not gpus:
            return Decision(None, notes=[f"memory plan: the flat index is served on the CPU: --cpu_index {asked} is "
                                         "unused"])  # fmt: skip
        top = max(100 * s.held_bytes / s.device.total_bytes for s in gpus)
        return Decision(None, notes=[f"memory plan: the flat index fits under --gpu_memory_fraction {fraction:g} "
                                     f"(at most {top:.0f}% of a GPU): --cpu_index {asked} is unused"])  # fmt: skip
    total = over.device.total_bytes
    assert total
    share = f"{format_bytes(total)} ({100 * over.held_bytes / total:.0f}%)"
    need = (f"memory plan: the flat index needs {format_bytes(over.held_bytes)} of {over.device.name}'s {share}, over "
            f"--gpu_memory_fraction {fraction:g}")  # fmt: skip
    if fallback is not None:
        return Decision(fallback, warnings=[f"{need}: serving {fallback.path.name} on the CPU instead with the faiss "
                                            f"backend ({fallback.recall_note})"])  # fmt: skip
    found = f"; --cpu_index {asked} found no compressed index of {flat.name} beside it" if asked else ""
    return Decision(None, warnings=[f"{need}{found}: loading it anyway; {recommendation(flat)}"])


def _names_flat(record: BuildRecord, flat: Path) -> bool:
    """Whether ``record``'s source is ``flat``: the same file once resolved, or else the same file name."""
    source = Path(record.source)
    try:
        if source.resolve() == flat.resolve():
            return True
    except OSError:
        pass
    return source.name == flat.name


def _fallback(path: Path, record: BuildRecord | None, knob: dict[str, int | None], k: int) -> Fallback:
    """``path`` with its recall@``k`` at the value it will be served at (``knob``: --nprobe / --ef_search)."""
    if record is None:
        return Fallback(path, None, None, "no build record: its recall is not known")
    value = knob.get(record.search_param or "") or record.search_value
    recall, note, shown = stored_recall(record, record.search_param, value, k)
    return Fallback(path, record, recall[shown] if recall and shown is not None else None, note)


def find_fallback(flat: Path, rows: int, k: int, knob: dict[str, int | None] | None = None) -> Fallback | None:
    """``auto``: of the indexes beside ``flat`` whose build record names it as the source and holds ``rows`` rows, the
    one with the highest stored recall@``k`` at its stored search value (None: there is none)."""
    candidates = []
    for rec_file in sorted(flat.parent.glob("*.build.json")):
        path = rec_file.with_name(rec_file.name.removesuffix(".build.json"))
        if not path.is_file() or path.resolve() == flat.resolve():
            continue
        record = read_record(path)
        if record is None or record.rows != rows or not _names_flat(record, flat):
            continue
        candidates.append(_fallback(path, record, {}, k))
    best = max(candidates, key=lambda c: -1.0 if c.recall is None else c.recall, default=None)
    return _fallback(best.path, best.record, knob or {}, k) if best is not None else None


def given_fallback(path: Path, flat: Path, rows: int, k: int, knob: dict[str, int | None] | None = None) -> Fallback:
    """An explicit --cpu_index: refused when it is missing or its build record holds another number of rows."""
    if not path.is_file():
        raise IndexLoadError(f"--cpu_index {path}: no such index file")
    record = read_record(path)
    if record is not None and record.rows != rows:
        raise IndexLoadError(f"--cpu_index {path.name}: its build record ({record_path(path).name}) holds "
                             f"{record.rows:,} rows, the flat index {flat.name} {rows:,}: not the same "
                             "corpus")  # fmt: skip
    return _fallback(path, record, knob or {}, k)


def choose(config: ServerConfig, plan: Plan) -> ServerConfig | None:
    """The config that serves the fallback on the CPU with the faiss backend, when ``plan`` (of the flat index) does
    not fit under --gpu_memory_fraction and there is one; None: serve the flat index. Logs why either way."""
    assert config.index_path is not None
    flat, rows = Path(config.index_path), plan.layout.rows
    knob = {"nprobe": config.nprobe, "efSearch": config.ef_search}
    fallback = None
    if config.cpu_index == "auto":
        fallback = find_fallback(flat, rows, config.topk, knob)
        if fallback is not None:
            logger.info("--cpu_index auto: %s (%s)", fallback.path.name, fallback.recall_note)
    elif config.cpu_index is not None:
        fallback = given_fallback(Path(config.cpu_index), flat, rows, config.topk, knob)
    decision = decide(plan.shares, config.gpu_memory_fraction, flat, fallback, config.cpu_index)
    for line in decision.warnings:
        logger.warning("%s", line)
    for line in decision.notes:
        logger.info("%s", line)
    if decision.fallback is None:
        given = [flag for flag, value in (("--nprobe", config.nprobe), ("--ef_search", config.ef_search)) if value]
        if given:
            logger.warning("%s applies to the --cpu_index fallback, which is not served: the flat index is searched "
                           "exactly", " and ".join(given))  # fmt: skip
        return None
    if decision.fallback.record is None:
        logger.warning("--cpu_index %s has no build record: its recall is not known; its rows are checked once loaded",
                       decision.fallback.path.name)  # fmt: skip
    return config.model_copy(update={"index_path": decision.fallback.path, "backend": "faiss", "faiss_gpu": False})
