"""The preflight's retriever probe accepts every server the tool can use and names the wire form it found."""

from __future__ import annotations

import pytest

from cpu_bench.background_server import BackgroundServer
from cpu_bench.testing.foreign_retrievers import search_r1_reference_app, skyrl_app
from cpu_bench.testing.stub_retriever import StubServer
from verl_search.launch.checks import PreflightError
from verl_search.launch.run_inputs import probe_retriever


@pytest.mark.parametrize(
    ("app_factory", "form"),
    [(search_r1_reference_app, "Search-R1 batch form"), (skyrl_app, "SkyRL single-query form")],
)
def test_servers_of_the_search_r1_family_pass_the_probe(app_factory, form):
    with BackgroundServer(app_factory()) as server:
        note = probe_retriever(server.url + "/retrieve", timeout=5)
    assert form in note and "(1 passage)" in note


def test_our_own_server_form_passes_and_a_broken_one_is_named():
    with StubServer() as stub:
        assert "Search-R1 batch form" in probe_retriever(stub.url + "/retrieve", timeout=5)
        stub.state.set_fault("400")
        with pytest.raises(PreflightError, match="answered HTTP 400"):
            probe_retriever(stub.url + "/retrieve", timeout=5)


def test_a_web_backend_replaying_or_out_of_budget_passes_with_what_it_means(tmp_path):
    """A replayed recording answers the probe with a labelled miss; a spent budget is a warning (the run can still
    train on what the cache holds), never the 'answered HTTP 503' error."""
    from local_dense_retriever.app import create_app
    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.engine import load_engine
    from verl_search.launch.checks import PreflightWarning

    replay = ServerConfig(backend="web", web_cache_mode="replay", web_cache_path=tmp_path / "web.sqlite3")
    spent = replay.model_copy(update={"web_cache_mode": "cache_first", "web_max_live_calls": 0})
    for config in (replay, spent):
        engine = load_engine(config, progress=False)
        try:
            with BackgroundServer(create_app(config, engine=engine)) as server:
                if config is replay:
                    assert "replays a web search cache" in probe_retriever(server.url + "/retrieve", timeout=5)
                else:
                    with pytest.raises(PreflightWarning, match="web search budget of this run is spent"):
                        probe_retriever(server.url + "/retrieve", timeout=5)
        finally:
            engine.backend.close()


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "test-key-not-used")  # a cache_first server needs one to start
