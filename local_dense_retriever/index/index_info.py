"""What a served index is: its type, the search-time parameter in effect, its memory and its stored recall against the
flat index it approximates (from its build record), as the ``index:`` load line, the ``ready:`` text and the /health
``index`` field show it. Invariant: recall is only ever a stored measurement (or 1.0 for an exact flat scan), never
estimated here."""

from __future__ import annotations

from dataclasses import dataclass

from local_dense_retriever.index.build_record import BuildRecord
from local_dense_retriever.load_progress import format_bytes

#: the server flag that sets each faiss search-time parameter
KNOB_FLAGS = {"nprobe": "--nprobe", "efSearch": "--ef_search"}


@dataclass(frozen=True)
class IndexInfo:
    """``type``: the record's index_type, else the faiss class name (``flat`` for the torch backend); ``bytes`` and
    ``bytes_source`` (how they were counted); ``recall`` {k: recall@k vs flat} at the served value, None: unknown."""

    type: str
    factory: str | None
    search_param: str | None
    search_value: int | None
    recall: dict[int, float] | None
    recall_note: str
    bytes: int
    bytes_source: str
    recall_k: int | None = None  # the k the short form shows (the server's topk, else the nearest measured)

    def short(self) -> str:
        """``IVF4096,SQ8 (nprobe 32, recall@3 0.987 vs flat)``: what describe() starts with."""
        parts = [f"{self.search_param} {self.search_value}"] if self.search_param else []
        if self.exact:
            parts.append("exact")
        elif self.recall is not None and self.recall_k in self.recall:
            parts.append(f"recall@{self.recall_k} {self.recall[self.recall_k]:.3f} vs flat")
        else:
            parts.append(self.recall_note)
        return f"{self.factory or self.type} ({', '.join(parts)})"

    @property
    def exact(self) -> bool:
        return self.type == "flat" or self.type.startswith("IndexFlat")

    def log_line(self) -> str:
        """The one ``index:`` line logged at load."""
        factory = f", factory {self.factory}" if self.factory else ""
        param = f", {self.search_param} {self.search_value}" if self.search_param else ", no search-time parameter"
        size = f"{format_bytes(self.bytes)} ({self.bytes_source})"
        return f"index: {self.type}{factory}{param}; {self.recall_note}; {size}"

    def to_dict(self) -> dict:
        """The /health ``index`` field (recall's keys as JSON strings)."""
        recall = {str(k): v for k, v in self.recall.items()} if self.recall is not None else None
        return {"type": self.type, "factory": self.factory, "search_param": self.search_param,
                "search_value": self.search_value, "recall": recall, "recall_note": self.recall_note,
                "bytes": self.bytes}  # fmt: skip


def nearest_k(measured: list[int], k: int) -> int | None:
    """``k`` when measured, else the nearest measured k (the smaller on a tie); None when nothing was measured."""
    return min(measured, key=lambda m: (abs(m - k), m)) if measured else None


def stored_recall(
    record: BuildRecord | None, param: str | None, value: int | None, k: int
) -> tuple[dict[int, float] | None, str, int | None]:
    """(recall {k: value} at ``value``, a note saying what it is, the k to show) from ``record``."""
    if record is None:
        return None, "no build record", None
    at = f" at {param}={value}" if param else ""
    point = next((p for p in record.curve if p.value == value), None)
    if point is None or not point.recall:
        tried = sorted({p.value for p in record.curve if p.value is not None})
        measured = f"measured at {param}={', '.join(map(str, tried))}" if tried else "no recall measured"
        return None, f"recall not measured{at} ({measured})", None
    recall = {int(key): v for key, v in sorted(point.recall.items(), key=lambda item: int(item[0]))}
    shown = nearest_k(list(recall), k)
    assert shown is not None
    queries = f"{record.recall_queries:,} queries from {record.query_source}"
    note = f"recall@{shown} {recall[shown]:.3f} vs flat{at} ({queries})"
    return recall, note, shown


def flat_info(rows: int, dim: int, itemsize: int, k: int, dtype: str) -> IndexInfo:
    """The torch backend's flat index: exact (every row scored), its vectors as held."""
    return IndexInfo("flat", None, None, None, {k: 1.0}, f"exact: every row scored ({dtype})", rows * dim * itemsize,
                     f"{rows:,} x {dim} {dtype} vectors", recall_k=k)  # fmt: skip
