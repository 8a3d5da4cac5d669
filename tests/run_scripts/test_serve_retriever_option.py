"""RETRIEVER=serve in the training script: the Ray head and the Serve fleet commands, and verl joining that cluster
(DRY_RUN=1: printed and checked by the preflight, in this process, against verl's real config, nothing started)."""

from __future__ import annotations

TRAIN = "run_qwen2.5-3b_instruct_search_multiturn.sh"


def test_serve_retriever_plan_and_verl_joins_the_cluster(checked_run, small_env, tmp_path):
    env = {**small_env(tmp_path / "run"), "RETRIEVER": "serve", "RETRIEVER_REPLICAS": "2", "RETRIEVER_PORT": "8123"}
    result = checked_run(TRAIN, **env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "retriever: a Ray Serve fleet in the trainer's Ray cluster (auto):" in out
    assert "ray start --head --num-gpus 1 --disable-usage-stats" in out
    for knob in ("SERVE=1", "RAY_ADDRESS=auto", "PORT=8123", "REPLICAS=2", "REPLICA_GPUS=0", "launch_retriever.sh"):
        assert knob in out, knob
    assert "+ray_kwargs.ray_init.address=auto" in out  # verl's ray.init joins the cluster; the preflight accepted it
    # the cluster's workers get the per-step metrics file through the job's runtime environment
    assert f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={tmp_path}/run/metrics.jsonl" in out
    assert "preflight: passed" in result.stderr


def test_an_existing_cluster_is_joined_not_started(checked_run, small_env, tmp_path):
    env = {**small_env(tmp_path / "run"), "RETRIEVER": "serve", "RAY_ADDRESS": "10.0.0.1:6379"}
    result = checked_run(TRAIN, **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ray start" not in result.stdout
    assert "+ray_kwargs.ray_init.address=10.0.0.1:6379" in result.stdout


def test_unknown_retriever_mode_is_refused(run_script, small_env, tmp_path):
    result = run_script(TRAIN, **{**small_env(tmp_path / "run"), "RETRIEVER": "fleet"})
    assert result.returncode == 1
    assert "RETRIEVER=fleet: choose url" in result.stderr
