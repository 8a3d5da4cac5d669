"""The service's errors form one tree under RetrieverError, and each keeps the builtin base its callers catch."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import local_dense_retriever
from local_dense_retriever.errors import RetrieverError


def _service_modules():
    for info in pkgutil.walk_packages(local_dense_retriever.__path__, "local_dense_retriever."):
        if info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def test_every_service_error_is_under_retriever_error():
    errors = {
        f"{module.__name__}.{name}": cls
        for module in _service_modules()
        for name, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == module.__name__
    }
    assert len(errors) >= 16, sorted(errors)  # the tree drawn in local_dense_retriever/errors.py
    outside = sorted(name for name, cls in errors.items() if not issubclass(cls, RetrieverError))
    assert outside == []


def test_old_import_paths_and_builtin_bases_still_hold():
    from local_dense_retriever.artifacts.sources import DownloadError, SizeMismatch
    from local_dense_retriever.batcher import BatcherStopped, Overloaded, QueryRejected
    from local_dense_retriever.corpus_store import CorpusError
    from local_dense_retriever.encoder import EncoderError
    from local_dense_retriever.index.base import IndexLoadError
    from local_dense_retriever.pages import PagesError
    from local_dense_retriever.serve.errors import ShardingError

    for cls in (DownloadError, SizeMismatch, BatcherStopped, Overloaded, CorpusError, EncoderError, IndexLoadError,
                PagesError):  # fmt: skip
        assert issubclass(cls, RuntimeError) and issubclass(cls, RetrieverError)
    assert issubclass(QueryRejected, ValueError) and issubclass(ShardingError, ValueError)
