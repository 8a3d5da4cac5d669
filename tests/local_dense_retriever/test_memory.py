"""The C heap: its stats tell what is in use from what malloc holds free, and a trim gives the free pages back."""

from __future__ import annotations

import asyncio
import mmap
import platform

import pytest

from local_dense_retriever import memory

LIBC, VERSION = platform.libc_ver()
glibc = pytest.mark.skipif(
    LIBC != "glibc" or tuple(map(int, VERSION.split("."))) < (2, 33), reason="malloc_trim and mallinfo2: glibc 2.33+"
)


@glibc
def test_freed_heap_memory_goes_back_to_the_os_on_a_trim():
    memory.release_free_memory()
    blocks = [bytearray(64_000) for _ in range(2_500)]  # ~160 MB from malloc's heap (each below the mmap threshold)
    for b in blocks:
        b[0] = 1
    held = memory.heap_stats()
    del blocks[::2]  # every other block freed: holes the heap's top trim alone cannot give back
    freed = memory.heap_stats()
    assert freed["free"] - held["free"] > 50 * 2**20 and freed["in_use"] < held["in_use"]
    assert memory.release_free_memory()
    trimmed = memory.heap_stats()
    assert freed["rss"] - trimmed["rss"] > 40 * 2**20  # the holes' pages left the process
    assert abs(trimmed["in_use"] - freed["in_use"]) < 8 * 2**20  # nothing in use was touched
    del blocks


@glibc
def test_resident_memory_is_split_into_the_processs_own_and_mapped_files(tmp_path):
    """A soak tells a leak (``rss_anon`` growing) from a corpus being read (``rss_file`` growing, up to its size)."""
    path = tmp_path / "mapped.bin"
    path.write_bytes(b"x" * (48 * 2**20))
    before = memory.heap_stats()
    own = bytearray(96 * 2**20)
    for i in range(0, len(own), 4096):  # fault every page in
        own[i] = 1
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert sum(m[i] for i in range(0, len(m), 4096)) == ord("x") * (len(m) // 4096)
        after = memory.heap_stats()
    assert after["rss_anon"] - before["rss_anon"] > 80 * 2**20
    assert after["rss_file"] - before["rss_file"] > 36 * 2**20
    assert abs(after["rss_anon"] + after["rss_file"] - after["rss"]) < 16 * 2**20  # and little else (shared memory)
    del own


def test_the_periodic_trim_runs_until_cancelled(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append(1) or True)

    async def run() -> None:
        task = asyncio.create_task(memory.release_free_memory_every(0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    if memory._LIBC is not None:
        assert len(calls) >= 3
    ran = len(calls)
    asyncio.run(asyncio.sleep(0.05))
    assert len(calls) == ran


def test_a_zero_interval_never_trims(monkeypatch):
    monkeypatch.setattr(memory, "release_free_memory", lambda: pytest.fail("trimmed"))
    asyncio.run(asyncio.wait_for(memory.release_free_memory_every(0), 1))


@pytest.mark.skipif(platform.system() != "Linux" or memory._LIBC is None, reason="madvise and /proc: Linux")
def test_released_pages_of_a_mapped_index_read_back_the_same_and_nothing_else_is_touched(tmp_path):
    """The pages a read of a memory-mapped file brought in leave the process's RSS (and read back unchanged);
    anonymous memory, or a writable map, is never advised: there the advice would discard data."""
    import numpy as np

    data = np.arange(4_000_000, dtype=np.float32).reshape(-1, 40)  # 16 MB
    np.save(tmp_path / "v.npy", data)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    assert float(mapped.sum(dtype=np.float64)) == float(data.sum(dtype=np.float64))  # every page read
    before = memory.resident_memory()["rss_file"]
    assert memory.release_mapped_pages(mapped[10:])  # a slice: its pages, from the page holding its first row
    assert before - memory.resident_memory()["rss_file"] > 15 << 20
    np.testing.assert_array_equal(mapped, data)
    anonymous = data.copy()
    assert not memory.release_mapped_pages(anonymous)
    writable = np.load(tmp_path / "v.npy", mmap_mode="r+")
    assert not memory.release_mapped_pages(writable)
    np.testing.assert_array_equal(anonymous, data)
    np.testing.assert_array_equal(writable, data)
