"""The memory plan: what the server will hold on each device, logged as ``memory plan:`` lines before it loads.
Invariant: ``plan_memory`` and ``plan_lines`` are arithmetic over any devices; ``make_plan`` alone reads the files and
devices, and places the index with the loader's own rules (``index.torch_flat.shard_bounds``)."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from local_dense_retriever.config import ServerConfig, encoder_dtype, index_dtype, reranker_dtype, resolve_device
from local_dense_retriever.load_progress import format_bytes
from local_dense_retriever.memory import physical_memory

#: bytes per value of the precisions an index or an encoder is held in
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
#: safetensors dtypes that hold weights the encoder keeps (its integer buffers are negligible)
_FLOAT_TENSORS = {"F64", "F32", "F16", "BF16"}


@dataclass(frozen=True)
class Device:
    """A device to plan for: ``cuda:N`` or ``cpu``, and its memory (None: not known)."""

    name: str
    total_bytes: int | None = None


@dataclass(frozen=True)
class IndexLayout:
    """How an index is held: ``index_bytes`` in ``dtype`` (rows 0: a shape not read), a float32 file ``mapped`` on
    the CPU, a pre-scan copy in ``coarse_dtype``, and ``scratch_bytes`` of working memory on each GPU."""

    rows: int
    dim: int
    dtype: str
    index_bytes: int
    mapped: bool = False
    coarse_dtype: str | None = None
    scratch_bytes: int = 0
    scratch_name: str = "score buffer"


@dataclass(frozen=True)
class EncoderSize:
    """A model's weights (the query encoder's, the reranker's): on ``device``, ``bytes`` in ``dtype`` (None: not known
    before it loads)."""

    device: Device
    bytes: int | None
    dtype: str
    name: str = "encoder"


@dataclass(frozen=True)
class Share:
    """What one device will hold."""

    device: Device
    rows: int = 0
    index_bytes: int = 0
    mapped: bool = False
    coarse_bytes: int = 0
    scratch_bytes: int = 0
    models: tuple[EncoderSize, ...] = ()

    @property
    def held_bytes(self) -> int:
        """Memory of its own (a mapped index's pages are the page cache's, not counted)."""
        models = sum(m.bytes or 0 for m in self.models)
        return (0 if self.mapped else self.index_bytes) + self.coarse_bytes + self.scratch_bytes + models


def plan_memory(layout: IndexLayout, devices: Sequence[Device], *models: EncoderSize | None) -> list[Share]:
    """Each device's share of the index (the loader's split), and each model (encoder, reranker) on its device."""
    from local_dense_retriever.index.torch_flat import shard_bounds

    shares = []
    for device, (lo, hi) in zip(devices, shard_bounds(layout.rows, len(devices)), strict=True):
        rows = hi - lo
        gpu = device.name.startswith("cuda")
        held = layout.index_bytes * rows // layout.rows if layout.rows else layout.index_bytes // len(devices)
        shares.append(
            Share(
                device,
                rows=rows,
                index_bytes=held,
                mapped=layout.mapped and not gpu,
                coarse_bytes=rows * layout.dim * ITEMSIZE[layout.coarse_dtype] if layout.coarse_dtype else 0,
                scratch_bytes=layout.scratch_bytes if gpu else 0,
            )
        )
    for model in filter(None, models):  # on its device's share, else a share of its own (the CPU beside GPUs)
        i = next((i for i, s in enumerate(shares) if s.device.name == model.device.name), None)
        if i is None:
            shares.append(Share(model.device, models=(model,)))
        else:
            shares[i] = replace(shares[i], models=(*shares[i].models, model))
    return shares


def _parts(share: Share, layout: IndexLayout) -> str:
    parts = []
    if share.index_bytes and not share.mapped:
        parts.append(f"index {format_bytes(share.index_bytes)}")
    if share.coarse_bytes:
        parts.append(f"{layout.coarse_dtype} pre-scan copy {format_bytes(share.coarse_bytes)}")
    if share.scratch_bytes:
        parts.append(f"{layout.scratch_name} {format_bytes(share.scratch_bytes)}")
    for model in share.models:
        size = format_bytes(model.bytes) if model.bytes is not None else "of unknown size"
        parts.append(f"{model.name} {size} ({model.dtype})")
    text = " + ".join(parts) or "nothing of its own"
    if share.mapped:
        text += f"; maps the file's {format_bytes(share.index_bytes)} of float32 rows (page cache, read as searched)"
    return text


def _body(share: Share, layout: IndexLayout, count: int) -> str:
    held, total = format_bytes(share.held_bytes) + (" each" if count > 1 else ""), share.device.total_bytes
    if total:
        ram = " RAM" if share.device.name == "cpu" else ""
        held += f" of {format_bytes(total)}{ram} ({100 * share.held_bytes / total:.0f}%)"
    return f"{held}: {_parts(share, layout)}"


def _names(devices: list[str]) -> str:
    """``cuda:0-7`` for a run of GPUs, ``cuda:1,3`` otherwise, ``cpu`` as it is."""
    if len(devices) == 1:
        return devices[0]
    ids = [int(name.split(":")[1]) for name in devices]
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"cuda:{ids[0]}-{ids[-1]}"
    return "cuda:" + ",".join(map(str, ids))


def plan_lines(shares: Sequence[Share], layout: IndexLayout, source: str) -> list[str]:
    """The log lines of a plan: what is loaded, then one line per device, devices that read the same in one line."""
    gpus = sum(s.device.name.startswith("cuda") and s.index_bytes > 0 for s in shares)
    where = f"over {gpus} GPU{'s' if gpus > 1 else ''}" if gpus else "on the CPU"
    shape = f"{layout.rows:,} x {layout.dim}" if layout.rows else format_bytes(layout.index_bytes)
    head = f"memory plan: {source}, {shape} in {layout.dtype} {where}"
    if any(s.device.name.startswith("cuda") for s in shares):
        head += " (plus each GPU's CUDA context and the models' activations)"
    lines = [head]
    groups: list[tuple[str, list[Share]]] = []
    for share in shares:
        text = _body(share, layout, 1)
        if groups and groups[-1][0] == text and share.device.name != "cpu":
            groups[-1][1].append(share)
        else:
            groups.append((text, [share]))
    names = [_names([s.device.name for s in members]) for _, members in groups]
    return lines + [f"memory plan: {n}: {_body(m[0], layout, len(m))}" for n, (_, m) in zip(names, groups, strict=True)]


def weight_bytes(model: str, dtype: str) -> int | None:
    """Bytes of the encoder ``model`` in ``dtype`` from its weight files; None when they are not on this machine."""
    folder = Path(model)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model, local_files_only=True))
        except Exception:  # not downloaded yet (or not a hub id): the encoder's load says what is wrong
            return None
    values = 0
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):  # unreadable here: the encoder's load says why
            return None
        values += sum(
            math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__" and t["dtype"] in _FLOAT_TENSORS
        )
    if not values:
        values = sum(p.stat().st_size for p in folder.glob("*.bin")) // 4
    return values * ITEMSIZE[dtype] if values else None


def _cuda_devices(devices: Sequence[torch.device]) -> list[Device]:
    return [Device(f"cuda:{d.index}", torch.cuda.get_device_properties(d.index).total_memory) for d in devices]


def _model_sizes(config: ServerConfig, cpu: Device) -> list[EncoderSize]:
    """The encoder's and, when one is set, the reranker's device, precision (``config``'s rules) and weights."""
    device = resolve_device(config.device)
    where = _cuda_devices([torch.device("cuda", device.index or 0)])[0] if device.type == "cuda" else cpu
    dtype = str(encoder_dtype(config.requested_encoder_dtype(), device)).removeprefix("torch.")
    models = [EncoderSize(where, weight_bytes(config.retriever_model, dtype), dtype)]
    if config.reranker_model:
        dtype = str(reranker_dtype(device, config.fp16)).removeprefix("torch.")
        models.append(EncoderSize(where, weight_bytes(str(config.reranker_model), dtype), dtype, "reranker"))
    return models


def _torch_layout(config: ServerConfig, path: Path) -> tuple[IndexLayout, list[torch.device]]:
    """The torch backend: the index's shape, precision and devices as ``TorchFlatIndex.from_file`` places them."""
    from local_dense_retriever.accel.rule import chosen_copy
    from local_dense_retriever.index.torch_flat import index_source, shard_devices

    device = resolve_device(config.device)
    dtype = index_dtype(config.index_dtype, device)
    source = index_source(path, device, config.index_dtype)
    rows, dim = int(source.shape[0]), int(source.shape[1])
    devices = shard_devices(device)
    itemsize = ITEMSIZE[dtype]
    if device.type == "cuda":  # a step's score buffer: at most score_buffer_mb, less for small shards
        scratch = min(config.score_buffer_mb << 20, config.max_batch_size * -(-rows // len(devices)) * itemsize)
        coarse = None
    else:  # CPU steps are small and their buffers are reused (index.scan.ScoreBuffers)
        scratch = 0
        coarse = chosen_copy(config.index_prefilter, device, config.index_dtype, (rows, dim))
    mapped = isinstance(source, np.ndarray) and device.type == "cpu"
    return IndexLayout(rows, dim, dtype, rows * dim * itemsize, mapped, coarse, scratch), devices


def _faiss_layout(config: ServerConfig, path: Path) -> tuple[IndexLayout, list[torch.device]]:
    """The faiss backend: as read on the CPU, or fp16 shards over every visible GPU with ``--faiss_gpu``."""
    from local_dense_retriever.index.faiss_index import GPU_SCRATCH_BYTES
    from local_dense_retriever.index.flat_file import is_flat_file, read_flat_header

    header = read_flat_header(path) if is_flat_file(path) else None  # any other kind: held as stored
    rows, dim = (header.ntotal, header.dim) if header is not None else (0, 0)
    dtype, itemsize = ("float16", 2) if config.faiss_gpu else ("float32", 4)
    held = (dtype, rows * dim * itemsize) if header is not None else ("its stored form", path.stat().st_size)
    if not config.faiss_gpu:
        return IndexLayout(rows, dim, *held), [torch.device("cpu")]
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    scratch = {"scratch_bytes": GPU_SCRATCH_BYTES, "scratch_name": "faiss temporary memory"}
    return IndexLayout(rows, dim, *held, **scratch), devices


@dataclass(frozen=True)
class Plan:
    """What serving ``source`` will hold (``shares``, one per device) and how its index is held (``layout``)."""

    shares: list[Share]
    layout: IndexLayout
    source: str

    def lines(self) -> list[str]:
        return plan_lines(self.shares, self.layout, self.source)


def make_plan(config: ServerConfig, backend: str) -> Plan:
    """The plan of serving ``config.index_path`` with the ``torch`` or ``faiss`` backend (reads the files, devices)."""
    assert config.index_path is not None
    path = Path(config.index_path)
    layout, devices = (_torch_layout if backend == "torch" else _faiss_layout)(config, path)
    cpu = Device("cpu", physical_memory() or None)
    planned = _cuda_devices(devices) if devices[0].type == "cuda" else [cpu]
    return Plan(plan_memory(layout, planned, *_model_sizes(config, cpu)), layout, path.name)
