"""The actor's attention is chosen by transformers' own FlashAttention-2 check, and padding removal follows it: both
combinations composed through the real run script and checked by the preflight."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_search.launch.attention import choose_attention
from verl_search.launch.checks import LaunchContext
from verl_search.launch.environment import InstalledEnvironment
from verl_search.launch.preflight import run_check
from verl_search.launch.runtime import check_attention
from verl_search.launch.trainer_config import compose_launch_config

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "run_scripts" / "run_qwen2.5-3b_instruct_search_multiturn.sh"
KEYS = ("actor_rollout_ref.model.override_config.attn_implementation", "actor_rollout_ref.model.use_remove_padding")


class Environment:
    """An environment where FlashAttention-2 is usable or not (``problem``), flash-attn 2.8.3 when it is."""

    def __init__(self, problem: str | None) -> None:
        self.problem = problem

    def python(self) -> str:
        return "3.11"

    def version(self, distribution: str) -> str | None:
        return "2.8.3" if distribution == "flash-attn" and self.problem is None else None

    def import_error(self, module: str) -> str | None:
        return None

    def flash_attention_2(self) -> str | None:
        return self.problem


def test_auto_takes_flash_attention_2_only_where_transformers_finds_it():
    found = choose_attention("auto", None)
    assert (found.implementation, found.remove_padding) == ("flash_attention_2", True)
    missing = choose_attention("auto", "flash-attn is not installed")
    assert (missing.implementation, missing.remove_padding) == ("sdpa", False)
    assert "flash-attn is not installed" in missing.reason
    assert choose_attention("eager", None).remove_padding is False
    assert choose_attention("flash_attention_3", "anything").remove_padding is True


def test_this_machine_has_no_flash_attention_2_and_says_why():
    """transformers' check needs flash-attn and a CUDA device; this CPU machine has neither."""
    problem = InstalledEnvironment().flash_attention_2()
    assert problem is not None and ("not installed" in problem or "CUDA" in problem)


def composed(tmp_path: Path, attention: str) -> dict[str, object]:
    """The script's overrides for ATTN_IMPLEMENTATION=attention, composed with the installed verl."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHON": sys.executable, "DRY_RUN": "1", "SKIP_PREFLIGHT": "1", "ATTN_IMPLEMENTATION": attention}
    env |= {"RUN_DIR": str(tmp_path / "run"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    words = shlex.split(done.stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0].replace("\\\n", " "))
    config = compose_launch_config(words[words.index("verl.trainer.main_ppo") + 1 :]).config
    return {key: OmegaConf.select(config, key) for key in KEYS}


@pytest.mark.parametrize(
    ("requested", "implementation", "remove_padding"),
    [("auto", "sdpa", False), ("flash_attention_2", "flash_attention_2", True), ("sdpa", "sdpa", False)],
)
def test_the_script_composes_the_attention_with_the_padding_it_supports(
    tmp_path, requested, implementation, remove_padding
):
    """auto on this machine (no FlashAttention-2) and the two combinations a user can name."""
    assert composed(tmp_path, requested) == {KEYS[0]: implementation, KEYS[1]: remove_padding}


def context(*overrides: str, environment: Environment, dry_run: bool = True) -> LaunchContext:
    config = compose_launch_config(["actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct", *overrides]).config
    ctx = LaunchContext(config, dry_run=dry_run)
    ctx.environment = environment
    return ctx


SDPA = (f"+{KEYS[0]}=sdpa", f"{KEYS[1]}=False")
FA2 = (f"+{KEYS[0]}=flash_attention_2", f"{KEYS[1]}=True")


def test_the_preflight_passes_both_combinations_where_they_run():
    sdpa = run_check("attention", lambda: check_attention(context(*SDPA, environment=Environment("no flash-attn"))))
    assert (sdpa.level, sdpa.message) == ("ok", "sdpa, padded batches")
    fa2 = run_check("attention", lambda: check_attention(context(*FA2, environment=Environment(None), dry_run=False)))
    assert (fa2.level, fa2.message) == ("ok", "flash_attention_2 (flash-attn 2.8.3), padding removed")


def test_flash_attention_2_without_it_is_an_error_for_a_launch_that_names_the_fix():
    environment = Environment("flash-attn is not installed")
    real = run_check("attention", lambda: check_attention(context(*FA2, environment=environment, dry_run=False)))
    assert real.level == "error"
    assert "flash_attention_2 needs FlashAttention-2 and flash-attn is not installed" in real.message
    assert "ATTN_IMPLEMENTATION=sdpa" in real.message
    dry = run_check("attention", lambda: check_attention(context(*FA2, environment=environment)))
    assert dry.level == "warning"  # a dry run may check on a machine that does not train


def test_padding_removal_without_a_flash_attention_kernel_is_named():
    ctx = context(f"+{KEYS[0]}=sdpa", f"{KEYS[1]}=True", environment=Environment(None))
    result = run_check("attention", lambda: check_attention(ctx))
    assert result.level == "warning"
    assert f"set {KEYS[1]}=False" in result.message
