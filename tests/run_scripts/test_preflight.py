"""The preflight in-process: each launch problem users used to meet on GPUs is reported by name, before them."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cpu_bench.testing.stub_retriever import StubServer
from verl_search.launch.checks import LaunchContext
from verl_search.launch.preflight import Finding, main, planned_checks, run_check, run_preflight
from verl_search.launch.tool_yaml import write_tool_config
from verl_search.launch.trainer_config import LaunchConfigError, compose_launch_config

REPO = Path(__file__).resolve().parents[2]
TOOL_YAML = REPO / "tool_config" / "search_tool_config.yaml"
AGENT_YAML = REPO / "tool_config" / "search_r1_agent.yaml"


@pytest.fixture
def tool_yaml(tmp_path, retriever_url) -> Path:
    return write_tool_config(TOOL_YAML, tmp_path / "tools.yaml", retriever_url)


@pytest.fixture
def overrides(data_dir, tool_yaml) -> list[str]:
    """A one-GPU launch like the training script's, minus the knobs that do not matter here."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/val_subset.parquet",
        "data.train_batch_size=4",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=6000",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_yaml}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "reward.custom_reward_function.path=pkg://verl_search.reward",
        "trainer.n_gpus_per_node=1",
        'trainer.logger=["console"]',  # wandb's login has its own tests
    ]


def check(overrides: list[str], *extra: str, dry_run: bool = True, agent: str | None = "tool_agent") -> list[Finding]:
    """The whole preflight, as the scripts run it."""
    return run_preflight([*overrides, *extra], dry_run=dry_run, expected_agent=agent, out=io.StringIO())


def check_only(
    only: str, overrides: list[str], *extra: str, dry_run: bool = True, agent: str | None = "tool_agent"
) -> list[Finding]:
    """The config composition plus only the checks named ``only`` (fast)."""
    try:
        composed = compose_launch_config([*overrides, *extra])
    except LaunchConfigError as e:
        return [Finding("error", "config", str(e))]
    findings = [Finding("error", "config", m) for m in composed.unknown_key_messages()]
    ctx = LaunchContext(composed.config, dry_run=dry_run, expected_agent=agent)
    return findings + [run_check(name, fn) for name, fn in planned_checks(ctx) if name == only]


def problems(findings: list[Finding], level: str = "error") -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for f in findings:
        if f.level == level:
            found.setdefault(f.check, []).append(f.message)
    return found


def test_a_good_launch_has_no_errors(overrides):
    findings = check(overrides)
    assert problems(findings) == {}
    assert {f.check for f in findings} >= {"config", "tools", "retriever", "reward", "tokenizer", "agent loops"}


@pytest.mark.parametrize(
    ("override", "where", "expected"),
    [
        ("actor_rollout_ref.rollout.multi_turn.format=qwen", "tool parser", "format=qwen is not a tool parser"),
        ("actor_rollout_ref.rollout.name=sglang_async", "rollout engine", "name=sglang_async mode=async is not"),
        ("actor_rollout_ref.rollout.multi_turn.max_tool_response_length=256", "tool response length", "=256 chars"),
        ("trainer.n_gpus_per_node=3", "verl validation", "must be divisible by minimal possible batch size (3)"),
        ("actor_rollout_ref.rollout.agent.default_agent_loop=no_such_agent", "agent loops", "'no_such_agent' is not"),
        ("data.train_files=~/train.parquet", "config", "a value starting with '~' is not valid hydra syntax"),
        ("data.train_files='~/train.parquet'", "data.train_files", "verl does not expand '~'"),
        ("data.train_batch_size=64", "data.train_files", "16 rows < data.train_batch_size=64"),
        ("actor_rollout_ref.model.path=/nonexistent/model", "tokenizer", "/nonexistent/model: no such folder"),
        ("reward.custom_reward_function.name=no_such_fn", "reward", "defines no 'no_such_fn'"),
    ],
)
def test_each_published_recipe_pitfall_is_an_error_naming_its_cause(overrides, override, where, expected):
    found = problems(check_only(where, overrides, override))
    assert where in found, found
    assert any(expected in message for message in found[where]), found[where]


def test_val_only_without_validation_first_is_an_error_because_verl_would_train(overrides):
    found = problems(
        check_only("verl validation", overrides, "trainer.val_only=True", "trainer.val_before_train=False")
    )
    assert "trainer.val_only=True needs trainer.val_before_train=True" in found["verl validation"][0]


def test_every_unknown_key_is_named_with_the_closest_real_key(overrides):
    findings = check_only(
        "tools", overrides, "actor_rollout_ref.rollout.multi_turn.max_turns=3", "trainer.nonexistent=1"
    )
    found = problems(findings)
    assert found["config"][0].startswith("unknown config key 'actor_rollout_ref.rollout.multi_turn.max_turns'")
    assert "actor_rollout_ref.rollout.multi_turn.max_assistant_turns" in found["config"][0]
    assert found["config"][1] == "unknown config key 'trainer.nonexistent'"
    assert [f.level for f in findings if f.check == "tools"] == ["ok"]  # the rest of the config is still checked


def test_a_tool_response_limit_below_the_tools_cap_is_a_warning(overrides):
    findings = check_only(
        "tool response length", overrides, "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=3000"
    )
    assert problems(findings) == {}
    assert "max_result_chars=6000" in problems(findings, "warning")["tool response length"][0]


def tool_yaml_with(tmp_path: Path, retriever_url: str, **config) -> Path:
    """The shipped tool YAML pointed at the stub, with ``config`` keys of the search tool changed."""
    path = write_tool_config(TOOL_YAML, tmp_path / "capped-tools.yaml", retriever_url)
    data = yaml.safe_load(path.read_text())
    data["tools"][0]["config"].update(config)
    path.write_text(yaml.safe_dump(data))
    return path


def tool_length_findings(overrides, tool_yaml: Path, limit: int) -> list[Finding]:
    return check_only(
        "tool response length",
        overrides,
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_yaml}",
        f"actor_rollout_ref.rollout.multi_turn.max_tool_response_length={limit}",
    )


@pytest.mark.parametrize(("cap", "limit"), [(2000, 2000), (1500, 2000), (300, 300)])
def test_a_tool_cap_within_verls_limit_passes_even_below_one_querys_passages(
    overrides, tmp_path, retriever_url, cap, limit
):
    """topk=3 passages (~2,400 chars) exceed verl's limit, but the tool itself never returns more than its cap."""
    tool_yaml = tool_yaml_with(tmp_path, retriever_url, topk=3, max_result_chars=cap)
    findings = tool_length_findings(overrides, tool_yaml, limit)
    assert problems(findings) == {} and problems(findings, "warning") == {}
    [ok] = [f for f in findings if f.check == "tool response length"]
    assert ok.level == "ok" and f"max_result_chars={cap}" in ok.message


def test_a_tool_cap_above_verls_limit_says_verl_cuts_silently(overrides, tmp_path, retriever_url):
    tool_yaml = tool_yaml_with(tmp_path, retriever_url, topk=3, max_result_chars=2000)
    found = problems(tool_length_findings(overrides, tool_yaml, 1000))  # below even one query's capped passages
    [message] = found["tool response length"]
    assert "max_result_chars=2000" in message and "=1000" in message and "verl cuts" in message


def test_a_tool_cap_above_verls_limit_that_fits_one_query_is_a_warning(overrides, tmp_path, retriever_url):
    tool_yaml = tool_yaml_with(tmp_path, retriever_url, topk=1, max_result_chars=4000)
    findings = tool_length_findings(overrides, tool_yaml, 2000)
    assert problems(findings) == {}
    [message] = problems(findings, "warning")["tool response length"]
    assert "max_result_chars=4000" in message and "verl cuts" in message


def test_data_that_asks_for_another_agent_is_an_error(overrides, native_data_dir):
    found = problems(check_only("agent loops", overrides, f"data.val_files={native_data_dir}/val_subset.parquet"))
    assert "rows ask for agent search_r1_agent but the launch asks for tool_agent" in found["agent loops"][0]


def test_the_native_agent_passes_with_its_loop_config(overrides, native_data_dir):
    findings = check_only(
        "agent loops",
        overrides,
        f"data.train_files={native_data_dir}/train.parquet",
        f"data.val_files={native_data_dir}/val_subset.parquet",
        "actor_rollout_ref.rollout.agent.default_agent_loop=search_r1_agent",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={AGENT_YAML}",
        agent="search_r1_agent",
    )
    assert problems(findings) == {}


def test_data_files_missing_columns_or_not_parquet_are_named(overrides, tmp_path):
    thin = tmp_path / "thin.parquet"
    pq.write_table(pa.table({"prompt": ["q"], "data_source": ["searchR1_nq"]}), thin)
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    found = problems(check_only("data.val_files", overrides, f"data.val_files=[{thin},{junk}]"))
    assert any(f"{thin}: missing column(s) reward_model" in m for m in found["data.val_files"])
    assert any(f"{junk}: cannot be read as parquet" in m for m in found["data.val_files"])


def test_a_tool_yaml_with_an_unknown_key_is_named(overrides, tmp_path):
    bad = tmp_path / "bad_tools.yaml"
    bad.write_text(TOOL_YAML.read_text().replace("topk: 3", "topk: 3\n      top_k: 3"))
    found = problems(check_only("tools", overrides, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}"))
    assert "unknown key 'top_k'" in found["tools"][0]


@pytest.mark.parametrize(("fault", "expected"), [("wrong_shape", "not in the /retrieve shape"), ("500", "HTTP 500")])
def test_a_retriever_that_answers_wrongly_is_named(overrides, tmp_path, fault, expected):
    with StubServer() as stub:
        stub.state.set_fault(fault)
        tools = write_tool_config(TOOL_YAML, tmp_path / "stub_tools.yaml", stub.url)
        override = f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}"
        found = problems(check_only("retriever", overrides, override))
    assert expected in found["retriever"][0]
    assert stub.url in found["retriever"][0]


def test_reward_functions_that_fail_are_named(overrides, tmp_path):
    raising = tmp_path / "raising.py"
    raising.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    1 / 0\n")
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def compute_score(**kw):\n    return 'high'\n")
    for path, expected in ((raising, "ZeroDivisionError"), (wrong, "expected a number or a dict")):
        found = problems(check_only("reward", overrides, f"reward.custom_reward_function.path={path}"))
        assert expected in found["reward"][0], found


def test_a_local_model_folder_is_checked_by_loading_its_tokenizer(overrides, tmp_path):
    from cpu_bench.train.local_tokenizer import ensure_tokenizer_dir

    model_dir = ensure_tokenizer_dir(tmp_path / "tok")
    findings = check_only("tokenizer", overrides, f"actor_rollout_ref.model.path={model_dir}")
    tokenizer = next(f for f in findings if f.check == "tokenizer")
    assert tokenizer.level == "ok" and "tokens" in tokenizer.message


def test_a_checkpoint_without_an_actor_is_named(overrides, tmp_path):
    step = tmp_path / "global_step_3"
    step.mkdir()
    resume = ("trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}")
    found = problems(check_only("checkpoint", overrides, *resume))
    assert "no actor/ folder" in found["checkpoint"][0]


def test_missing_gpus_are_an_error_in_a_real_launch_and_a_warning_in_a_dry_run(overrides):
    import torch

    if torch.cuda.device_count() >= 1:
        pytest.skip("this machine has a GPU")
    assert "gpus" in problems(check_only("gpus", overrides, dry_run=False))
    assert "gpus" in problems(check_only("gpus", overrides, dry_run=True), "warning")


def test_cli_exits_non_zero_with_one_line_per_problem(overrides, capsys):
    assert main(["--dry-run", "--agent", "tool_agent", "--", *overrides]) == 0
    assert "preflight: passed" in capsys.readouterr().err
    assert main(["--dry-run", "--", *overrides, "trainer.nonexistent=1", "data.train_files=/no/such.parquet"]) == 1
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if line.startswith("preflight: ERROR")]
    assert len(error_lines) == 2, err
    assert "preflight: FAILED with 2 error(s)" in err
