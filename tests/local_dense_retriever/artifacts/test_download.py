"""download.py on generated local files: join, gunzip, verify, resume, and a fast one-line failure when offline."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cpu_bench.background_server import free_port
from local_dense_retriever.artifacts.assembly import check_free_space
from local_dense_retriever.artifacts.download import BM25, CORPUS, INDEX, MANIFEST, download, is_done
from local_dense_retriever.artifacts.sources import DownloadError, MirrorSource, SizeMismatch

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def mirror(tmp_path: Path) -> dict:
    """A mirror folder laid out like the three hub repos, with small generated files."""
    rnd = random.Random(0)
    root = tmp_path / "mirror"
    files = {
        f"{INDEX.repo_id}/part_aa": rnd.randbytes(300_000),
        f"{INDEX.repo_id}/part_ab": rnd.randbytes(123_457),
        f"{BM25.repo_id}/bm25/_0.cfs": rnd.randbytes(5_000),
        f"{BM25.repo_id}/bm25/segments_1": b"segments",
    }
    corpus = "".join(json.dumps({"id": str(i), "contents": f'"T{i}"\npassage {i}'}) + "\n" for i in range(2_000))
    files[f"{CORPUS.repo_id}/wiki-18.jsonl.gz"] = gzip.compress(corpus.encode(), mtime=0)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return {"root": root, "files": files, "corpus": corpus.encode()}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp"))


def test_downloads_joins_and_decompresses(tmp_path: Path, mirror: dict) -> None:
    save = tmp_path / "save"
    outputs = download(save, [INDEX, CORPUS, BM25], MirrorSource(mirror["root"]), progress=False)
    files = mirror["files"]
    index = (save / "e5_Flat.index").read_bytes()
    assert index == files[f"{INDEX.repo_id}/part_aa"] + files[f"{INDEX.repo_id}/part_ab"]
    assert (save / "wiki-18.jsonl").read_bytes() == mirror["corpus"]
    assert (save / "bm25" / "_0.cfs").read_bytes() == files[f"{BM25.repo_id}/bm25/_0.cfs"]
    assert outputs == [save / "e5_Flat.index", save / "wiki-18.jsonl", save / "bm25/_0.cfs", save / "bm25/segments_1"]
    manifest = json.loads((save / MANIFEST).read_text())
    assert manifest["index"]["outputs"] == {"e5_Flat.index": len(index)}
    assert (save / "part_aa").exists() and (save / "wiki-18.jsonl.gz").exists(), "parts are kept by default"
    assert _leftovers(save) == []


def test_rerun_skips_complete_outputs_even_without_a_source(tmp_path: Path, mirror: dict) -> None:
    save = tmp_path / "save"
    download(save, [INDEX, CORPUS], MirrorSource(mirror["root"]), progress=False)
    before = (save / "e5_Flat.index").stat().st_mtime_ns
    gone = MirrorSource(tmp_path / "no-such-mirror")
    assert download(save, [INDEX, CORPUS], gone, progress=False) == [save / "e5_Flat.index", save / "wiki-18.jsonl"]
    assert gone.fetched == []
    assert (save / "e5_Flat.index").stat().st_mtime_ns == before


def test_resume_fetches_only_the_missing_part(tmp_path: Path, mirror: dict) -> None:
    save = tmp_path / "save"
    save.mkdir()
    (save / "part_aa").write_bytes(mirror["files"][f"{INDEX.repo_id}/part_aa"])  # finished before an interruption
    source = MirrorSource(mirror["root"])
    download(save, [INDEX], source, progress=False)
    assert source.fetched == [(INDEX.repo_id, "part_ab")]
    assert is_done(save, INDEX)


def test_part_with_a_wrong_size_on_disk_is_fetched_again(tmp_path: Path, mirror: dict) -> None:
    save = tmp_path / "save"
    save.mkdir()
    (save / "part_aa").write_bytes(b"half a part")
    download(save, [INDEX], MirrorSource(mirror["root"]), progress=False)
    files = mirror["files"]
    assert (save / "e5_Flat.index").read_bytes() == files[f"{INDEX.repo_id}/part_aa"] + files[
        f"{INDEX.repo_id}/part_ab"
    ]


def test_deleted_output_is_rebuilt_from_parts_without_fetching(tmp_path: Path, mirror: dict) -> None:
    save = tmp_path / "save"
    download(save, [INDEX], MirrorSource(mirror["root"]), progress=False)
    (save / "e5_Flat.index").unlink()
    assert not is_done(save, INDEX)
    source = MirrorSource(mirror["root"])
    download(save, [INDEX], source, progress=False)
    assert source.fetched == []
    assert (save / "e5_Flat.index").stat().st_size == 300_000 + 123_457


class TruncatingSource(MirrorSource):
    """A source whose transfers end early, as a dropped connection leaves them."""

    def fetch(self, repo_id: str, filename: str, dest_dir: Path) -> Path:
        path = super().fetch(repo_id, filename, dest_dir)
        with open(path, "r+b") as f:
            f.truncate(1_000)
        return path


def test_truncated_transfer_is_a_size_mismatch_and_leaves_nothing_complete_looking(
    tmp_path: Path, mirror: dict
) -> None:
    save = tmp_path / "save"
    with pytest.raises(SizeMismatch, match=r"part_aa has 1,000 bytes but the source declares 300,000"):
        download(save, [INDEX], TruncatingSource(mirror["root"]), progress=False)
    assert not (save / "e5_Flat.index").exists()
    assert not (save / "part_aa").exists(), "a corrupt part is removed so the next run fetches it again"
    assert not is_done(save, INDEX) and not (save / MANIFEST).exists()
    download(save, [INDEX], MirrorSource(mirror["root"]), progress=False)  # the re-run recovers
    assert is_done(save, INDEX)


def test_corrupt_gzip_gives_a_clear_error_and_no_output(tmp_path: Path, mirror: dict) -> None:
    gz = mirror["root"] / CORPUS.repo_id / "wiki-18.jsonl.gz"
    gz.write_bytes(gz.read_bytes()[:-100])
    save = tmp_path / "save"
    with pytest.raises(DownloadError, match="is not a complete gzip file"):
        download(save, [CORPUS], MirrorSource(mirror["root"]), progress=False)
    assert not (save / "wiki-18.jsonl").exists()
    assert _leftovers(save) == []


def test_delete_parts_keeps_only_verified_outputs(tmp_path: Path, mirror: dict) -> None:
    save = tmp_path / "save"
    download(save, [INDEX, CORPUS], MirrorSource(mirror["root"]), delete_parts=True, progress=False)
    assert sorted(p.name for p in save.iterdir()) == sorted([MANIFEST, "e5_Flat.index", "wiki-18.jsonl"])
    assert is_done(save, INDEX) and is_done(save, CORPUS)


def test_a_repo_without_the_expected_file_fails_before_writing(tmp_path: Path, mirror: dict) -> None:
    (mirror["root"] / INDEX.repo_id / "part_ab").unlink()
    save = tmp_path / "save"
    with pytest.raises(DownloadError, match="PeterJinGo/wiki-18-e5-index .* has no file part_ab"):
        download(save, [CORPUS, INDEX], MirrorSource(mirror["root"]), progress=False)
    assert list(save.iterdir()) == [], "sizes are checked for every artifact before any byte is written"


def test_free_space_check_names_need_and_free(tmp_path: Path) -> None:
    check_free_space(tmp_path, 1)
    with pytest.raises(DownloadError, match=r"not enough disk space in .*GB needed, .*GB free"):
        check_free_space(tmp_path, 1 << 60)


def _cli(args: list[str], **env: str) -> subprocess.CompletedProcess:
    script = REPO_ROOT / "local_dense_retriever" / "download.py"
    full_env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")} | env
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=full_env, timeout=120, check=False
    )


def test_cli_offline_fails_with_one_clear_line(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    res = _cli(["--save_path", str(tmp_path / "save")], HF_ENDPOINT=closed)
    assert res.returncode == 1
    assert res.stderr.startswith(f"download.py: error: cannot reach {closed}") and res.stderr.count("\n") == 1
    res = _cli(["--save_path", str(tmp_path / "save")], HF_HUB_OFFLINE="1")
    assert res.returncode == 1 and "HF_HUB_OFFLINE is set" in res.stderr


def test_cli_from_a_mirror_prints_the_outputs(tmp_path: Path, mirror: dict) -> None:
    save = tmp_path / "save"
    res = _cli(["--save_path", str(save), "--mirror", str(mirror["root"]), "--no_index"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [str(save / "wiki-18.jsonl")]
    res = _cli(["--save_path", str(save), "--no_index", "--no_corpus"])
    assert res.returncode == 1 and "nothing to download" in res.stderr


def test_a_rerun_removes_what_a_killed_download_left(tmp_path: Path, mirror: dict) -> None:
    import signal

    save = tmp_path / "save"
    save.mkdir()
    writer = (
        "import sys, time\nfrom pathlib import Path\nfrom verl_search.atomic import atomic_path\n"
        "with atomic_path(Path(sys.argv[1])) as tmp, open(tmp, 'wb') as f:\n"
        "    f.write(b'x' * 300_000); f.flush(); print('writing', flush=True); time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for name in ("part_ab", "e5_Flat.index"):  # a part being fetched, the join being written
        proc = subprocess.Popen([sys.executable, "-c", writer, str(save / name)], stdout=subprocess.PIPE, text=True,
                                env=env)  # fmt: skip
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(_leftovers(save)) == 2
    download(save, [INDEX], MirrorSource(mirror["root"]), progress=False)
    assert _leftovers(save) == []
