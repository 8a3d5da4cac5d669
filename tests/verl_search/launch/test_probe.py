"""The preflight's retriever probe accepts every server the tool can use and names the wire form it found."""

from __future__ import annotations

import pytest

from cpu_bench.background_server import BackgroundServer
from cpu_bench.testing.foreign_retrievers import search_r1_reference_app, skyrl_app
from cpu_bench.testing.stub_retriever import StubServer
from verl_search.launch.checks import PreflightError
from verl_search.launch.resources import probe_retriever


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
