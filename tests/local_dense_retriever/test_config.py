"""Settings shared by the service and the tooling: one cache folder for the whole project, one encoder factory for the
server and the index builder."""

from __future__ import annotations

from pathlib import Path

from local_dense_retriever.config import ServerConfig, default_cache_dir


def test_the_cache_folder_follows_verl_search_cache_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("VERL_SEARCH_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "verl_search"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "verl_search"
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    assert ServerConfig().cache_dir == tmp_path / "mine"  # the embedded default
    from cpu_bench.train.base_cache import cache_root

    assert cache_root() == tmp_path / "mine" / "base_models"  # the base models of make train / make demo


def test_server_and_index_builder_make_the_same_encoder(minilm_path: Path):
    """The builder encodes passages with the pooling, prefixes and precision the server will query with."""
    from local_dense_retriever.encoder import encoder_for

    config = ServerConfig(retriever_name="bge", retriever_model=str(minilm_path), encoder_dtype="float32")
    server = encoder_for(config)
    builder = encoder_for(config, device="cpu", max_length=512)
    for enc in (server, builder):
        assert enc.pooling == "cls" and enc.dtype.is_floating_point
        assert (enc.query_prefix, enc.passage_prefix) == (server.query_prefix, server.passage_prefix)
    assert (server.max_length, builder.max_length) == (config.query_max_length, 512)
