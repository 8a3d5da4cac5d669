"""The hydra overrides that plug our tool, agent loop and reward into verl's multi-turn rollout: the one mapping from
the search knobs to verl keys, used by the run scripts (``common.sh``'s ``vs_search_overrides``) and ``make train``.

Invariant: the trainer mode (``trainer.v1.trainer_mode``) is not composed here: the run scripts choose it
(``TRAINER_MODE``, ``SEARCH_MONITOR``) and callers append it.
"""

from __future__ import annotations

import argparse
import sys

#: the agent loops the run scripts accept
AGENTS = ("tool_agent", "search_r1_agent")


def search_overrides(
    agent: str,
    max_turns: int,
    max_tool_response_length: int,
    tool_config: str,
    reward_fn_path: str,
    agent_loop_config: str,
) -> list[str]:
    """verl overrides for a search run: hermes multi-turn with ``tool_config``, ``agent`` as the default loop (with
    its loop YAML for ``search_r1_agent``), our reward."""
    overrides = [
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={max_turns}",
        f"actor_rollout_ref.rollout.multi_turn.max_tool_response_length={max_tool_response_length}",
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=right",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={agent}",
        f"reward.custom_reward_function.path={reward_fn_path}",
        "reward.custom_reward_function.name=compute_score",
    ]
    if agent == "search_r1_agent":
        overrides.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config}")
    return overrides


def main(argv: list[str] | None = None) -> int:
    """Print the overrides, one per line (``mapfile -t`` reads them back)."""
    p = argparse.ArgumentParser(
        prog="python -m verl_search.launch.search_overrides", description=__doc__.split("\n")[0]
    )
    p.add_argument("--agent", required=True, choices=AGENTS)
    p.add_argument("--max-turns", required=True)
    p.add_argument("--max-tool-response-length", required=True)
    p.add_argument("--tool-config", required=True)
    p.add_argument("--reward-fn-path", required=True)
    p.add_argument("--agent-loop-config", required=True)
    a = p.parse_args(argv)
    overrides = search_overrides(
        a.agent, a.max_turns, a.max_tool_response_length, a.tool_config, a.reward_fn_path, a.agent_loop_config
    )
    print("\n".join(overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
