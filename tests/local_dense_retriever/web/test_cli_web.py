"""The web backend's command line: its flags, what it refuses at start-up, and a missing key named, never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_dense_retriever.retrieval_server import config_from_args, main


def test_the_web_flags_parse_into_the_config(tmp_path):
    config, _ = config_from_args(
        ["--backend", "web", "--web_provider", "brave", "--web_base_url", "http://127.0.0.1:9/s",
         "--web_api_key_env", "MY_BRAVE_KEY", "--web_cache_mode", "replay", "--web_cache_path", str(tmp_path / "c.db"),
         "--web_budget_scope", "nq-eval", "--web_max_live_calls", "500", "--web_cost_per_call", "0.003",
         "--web_max_spend", "1.5", "--web_qps", "2", "--web_timeout_s", "4", "--web_max_attempts", "2",
         "--web_fetch_max_bytes", "65536", "--web-fetch-timeout-s", "3.5", "--web_fetch_max_concurrency", "4",
         "--web_fetch_allow_loopback"]
    )  # fmt: skip
    assert config.resolved_backend() == "web" and not config.embedded_default
    assert (config.web_provider, config.web_api_key_env, config.web_cache_mode) == ("brave", "MY_BRAVE_KEY", "replay")
    assert config.web_cache_path == tmp_path / "c.db" and config.web_budget_scope == "nq-eval"
    assert (config.web_max_live_calls, config.web_cost_per_call, config.web_max_spend) == (500, 0.003, 1.5)
    assert (config.web_qps, config.web_timeout_s, config.web_max_attempts) == (2.0, 4.0, 2)
    assert (config.web_fetch_max_bytes, config.web_fetch_timeout_s, config.web_fetch_max_concurrency) == (65536, 3.5, 4)
    assert config.web_fetch_allow_loopback is True
    default, _ = config_from_args(["--backend", "web"])
    assert (default.web_provider, default.web_cache_mode) == ("serper", "cache_first")
    assert default.web_fetch_allow_loopback is False  # loopback pages are for tests only


def test_an_index_with_the_web_backend_is_refused_in_one_line(capsys):
    assert main(["--backend", "web", "--index_path", "x.index", "--corpus_path", "c.jsonl"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backend web searches the provider" in err


@pytest.mark.parametrize(
    "flag, value",
    [("--web_qps", "0"), ("--web_fetch_max_bytes", "100"), ("--web_fetch_max_bytes", str(1 << 30)),
     ("--web_fetch_timeout_s", "0"), ("--web_fetch_timeout_s", "1000"), ("--web_fetch_max_concurrency", "0")],
)  # fmt: skip
def test_bad_web_settings_exit_2(capsys, flag, value):
    assert main(["--backend", "web", flag, value]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and flag.removeprefix("--") in err


def test_loopback_pages_are_refused_on_a_server_others_can_reach(capsys):
    assert main(["--backend", "web", "--web_fetch_allow_loopback", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--web_fetch_allow_loopback is for tests" in err
    for host in ("127.0.0.1", "::1", "localhost"):
        assert config_from_args(["--backend", "web", "--web_fetch_allow_loopback", "--host", host])[0].host == host


def test_a_missing_key_stops_the_server_naming_the_variable(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.delenv("SERPAPI_API_KEY", raising=False)
    argv = ["--backend", "web", "--web_provider", "serpapi", "--port", "0", "--cache_dir", str(tmp_path)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "retrieval_server: error:" in err and "environment variable SERPAPI_API_KEY" in err
    monkeypatch.setenv("OTHER_KEY", "   ")  # blank counts as unset
    assert main([*argv, "--web_api_key_env", "OTHER_KEY"]) == 1
    assert "environment variable OTHER_KEY" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--backend", "web", "--retriever_model", "replay"], "--retriever_model"),
        (["--backend", "web", "--web_cache_mode", "replay", "--faiss_gpu"], "--faiss_gpu"),
        (["--web_cache_mode", "replay"], "--web_cache_mode"),
        (["--retriever_name", "bm25", "--web_provider", "brave"], "--web_provider"),
    ],
)
def test_a_flag_that_would_change_what_is_searched_is_refused_naming_it(capsys, argv, flag):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"retrieval_server: error: {flag} has no effect")


def test_a_tuning_flag_the_web_backend_ignores_is_logged_once(start_cli_server, tmp_path):
    log = tmp_path / "server.log"
    flags = ["--backend", "web", "--web_cache_mode", "replay", "--web_cache_path", str(tmp_path / "web.sqlite3"),
             "--max_batch_size", "8", "--no_batching", "--device", "cpu"]  # fmt: skip
    proc, _ = start_cli_server(flags, log)
    try:
        text = log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
    for flag in ("--max_batch_size", "--no_batching", "--device"):
        assert text.count(f"{flag} is ignored with --backend web") == 1, text
