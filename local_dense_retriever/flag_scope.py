"""Which flags have an effect on the backend a ServerConfig chooses. The rule: a flag given for another backend that
would change *what is searched* is refused (the server would search something else than asked); one that only tunes
how a backend runs is logged once as ignored (a launch script shared by backends keeps working). Only flags given
explicitly count (pydantic's ``model_fields_set``)."""

from __future__ import annotations

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.errors import RetrieverError

#: with --backend web, flags of the local backends that choose what is searched: refused
WEB_REFUSES = ("retriever_name", "retriever_model", "pooling", "faiss_gpu", "index_dtype", "index_prefilter",
               "toy_passages")  # fmt: skip
#: with --backend web, flags that only tune the encoder, the index scan or the micro-batches: ignored
WEB_IGNORES = ("encoder_dtype", "encoder_shape_multiple", "encoder_kernel_cache", "score_buffer_mb",
               "query_max_length", "faiss_gpu_id", "batching", "max_batch_size", "max_batch_tokens", "max_wait_ms",
               "unbatched_threads", "gpu_memory_fraction")  # fmt: skip
#: with --backend web and no rerank stage, flags only that stage would read: ignored
RERANK_ONLY = ("device", "fp16")


class FlagScopeError(RetrieverError, ValueError):
    """A flag given has no effect on the chosen backend and would change what is searched."""


def _flag(config: ServerConfig, name: str) -> str:
    """The flag as it was given: ``--no_x`` for a switch turned off."""
    return f"--no_{name}" if getattr(config, name) is False else f"--{name}"


def check_flag_scope(config: ServerConfig) -> list[str]:
    """The given flags the chosen backend ignores, each as one line to log; raises ``FlagScopeError`` naming the first
    flag that is refused."""
    given = config.model_fields_set
    if config.resolved_backend() == "web":
        refused = [name for name in WEB_REFUSES if name in given]
        if refused:
            flag = _flag(config, refused[0])
            raise FlagScopeError(f"{flag} has no effect with --backend web, which searches the provider's index, not a "
                                 "local one: drop it")  # fmt: skip
        ignored = [name for name in WEB_IGNORES if name in given]
        if config.reranker_model is None:
            ignored += [name for name in RERANK_ONLY if name in given]
        return [f"{_flag(config, name)} is ignored with --backend web (no local encoder, index or micro-batches)"
                for name in ignored]  # fmt: skip
    web_flags = sorted(name for name in given if name.startswith("web_"))
    if web_flags:
        raise FlagScopeError(
            f"{_flag(config, web_flags[0])} has no effect without --backend web: add --backend web or drop it"
        )
    return []
