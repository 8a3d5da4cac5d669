"""Where downloads come from: the Hugging Face hub (``HubSource``) or a local mirror folder (``MirrorSource``).

Both answer the same two questions, so the downloader never knows which it talks to: ``sizes(repo_id)`` lists every
file of a dataset repo with its size in bytes, and ``fetch(repo_id, filename, dest_dir)`` puts that file at
``dest_dir/filename`` (resuming where the source can). Every failure is raised as a ``DownloadError``.
"""

from __future__ import annotations

import logging
import shutil
import socket
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from local_dense_retriever.errors import RetrieverError
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)


class DownloadError(RetrieverError, RuntimeError):
    """A download could not be completed; the message is one line that says why and what to do."""


class SourceUnreachable(DownloadError):
    """The source cannot be reached at all (no network, HF_HUB_OFFLINE, a closed mirror endpoint)."""


class SizeMismatch(DownloadError):
    """A file's size differs from what the source declares (a truncated or corrupt transfer)."""


class FileSource(Protocol):
    """The fetch seam of the downloader."""

    def describe(self) -> str: ...

    def sizes(self, repo_id: str) -> dict[str, int]: ...

    def fetch(self, repo_id: str, filename: str, dest_dir: Path) -> Path: ...


class HubSource:
    """Dataset repos on the Hugging Face hub (``HF_ENDPOINT`` and ``HF_TOKEN`` are honoured by huggingface_hub)."""

    def __init__(self, endpoint: str | None = None, *, connect_timeout: float = 5.0) -> None:
        from huggingface_hub import constants

        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
        self.offline = constants.HF_HUB_OFFLINE
        self.connect_timeout = connect_timeout
        self._checked = False

    def describe(self) -> str:
        return self.endpoint

    def _preflight(self) -> None:
        """Fail in seconds, with one clear line, when the hub cannot be reached (rather than inside a retry loop)."""
        if self._checked:
            return
        if self.offline:
            raise SourceUnreachable("HF_HUB_OFFLINE is set: unset it to download, or copy the files in by hand")
        url = urlsplit(self.endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname or "", port), timeout=self.connect_timeout).close()
        except OSError as e:
            raise SourceUnreachable(
                f"cannot reach {self.endpoint} ({e.__class__.__name__}: {e}); check the network or set HF_ENDPOINT "
                "to a reachable mirror"
            ) from e
        self._checked = True

    def sizes(self, repo_id: str) -> dict[str, int]:
        import httpx
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError
        from huggingface_hub.hf_api import RepoFile

        self._preflight()
        try:
            tree = HfApi(endpoint=self.endpoint).list_repo_tree(repo_id, repo_type="dataset", recursive=True)
            return {
                item.path: int(item.size)
                for item in tree
                if isinstance(item, RepoFile) and not item.path.rsplit("/", 1)[-1].startswith(".")
            }
        except RepositoryNotFoundError as e:
            raise DownloadError(f"dataset repo {repo_id} not found on {self.endpoint} (or it needs HF_TOKEN)") from e
        except (httpx.HTTPError, OSError, ValueError) as e:
            raise DownloadError(f"listing {repo_id} on {self.endpoint} failed: {e}".splitlines()[0]) from e

    def fetch(self, repo_id: str, filename: str, dest_dir: Path) -> Path:
        import httpx
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        self._preflight()
        try:
            path = hf_hub_download(repo_id, filename, repo_type="dataset", local_dir=dest_dir, endpoint=self.endpoint)
        except (httpx.HTTPError, OSError, ValueError, EntryNotFoundError) as e:
            raise DownloadError(f"downloading {repo_id}/{filename} failed: {e}".splitlines()[0]) from e
        return Path(path)


class MirrorSource:
    """A folder holding ``<root>/<owner>/<repo>/<files>`` (a copy made elsewhere, or a test fixture)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        #: every (repo_id, filename) copied, in order: tells callers what a resumed run really fetched
        self.fetched: list[tuple[str, str]] = []

    def describe(self) -> str:
        return str(self.root)

    def _repo(self, repo_id: str) -> Path:
        repo = self.root / repo_id
        if not self.root.is_dir():
            raise SourceUnreachable(f"mirror folder {self.root} does not exist")
        if not repo.is_dir():
            raise DownloadError(f"dataset repo {repo_id} not found in mirror {self.root}")
        return repo

    def sizes(self, repo_id: str) -> dict[str, int]:
        repo = self._repo(repo_id)
        return {
            p.relative_to(repo).as_posix(): p.stat().st_size
            for p in sorted(repo.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        }

    def fetch(self, repo_id: str, filename: str, dest_dir: Path) -> Path:
        src = self._repo(repo_id) / filename
        dest = Path(dest_dir) / filename
        try:
            with atomic_path(dest) as tmp:
                shutil.copyfile(src, tmp)
        except OSError as e:
            raise DownloadError(f"copying {src} failed: {e}") from e
        self.fetched.append((repo_id, filename))
        logger.info("copied %s -> %s", src, dest)
        return dest
