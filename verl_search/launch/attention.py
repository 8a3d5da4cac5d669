"""The actor's attention for a run: ``ATTN_IMPLEMENTATION=auto`` takes FlashAttention-2 when transformers finds it
usable, else ``sdpa``; padding removal goes with the FlashAttention kernels only. The preflight checks the composed
config against the same constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_search.launch.environment import InstalledEnvironment

#: verl's attention when ``override_config.attn_implementation`` is unset
VERL_DEFAULT_ATTENTION = "flash_attention_2"
ATTENTION_KEY = "+actor_rollout_ref.model.override_config.attn_implementation"
REMOVE_PADDING_KEY = "actor_rollout_ref.model.use_remove_padding"
#: implementations whose kernels take packed variable-length sequences (what use_remove_padding feeds them)
PACKING_KERNELS = ("flash_attention_2", "flash_attention_3")


@dataclass(frozen=True)
class AttentionChoice:
    """What the actor (and reference) model load with."""

    implementation: str
    remove_padding: bool
    reason: str


def choose_attention(requested: str, fa2_problem: str | None) -> AttentionChoice:
    """``auto`` takes FlashAttention-2 when transformers finds it usable (``fa2_problem`` is None), else ``sdpa``;
    padding removal (sequences packed into one row) goes with FlashAttention kernels only, whose variable-length
    path keeps packed sequences apart."""
    if requested == "auto":
        if fa2_problem is None:
            return AttentionChoice(VERL_DEFAULT_ATTENTION, True, "transformers finds FlashAttention-2")
        return AttentionChoice("sdpa", False, f"no FlashAttention-2: {fa2_problem}")
    return AttentionChoice(requested, requested in PACKING_KERNELS, "set by ATTN_IMPLEMENTATION")


def attention_overrides(requested: str, rollout: str) -> tuple[list[str], str]:
    """The actor's attention and padding removal for ``ATTN_IMPLEMENTATION=requested`` (``auto`` probes the installed
    FlashAttention-2), and the note a script prints on its choice (with the rollout engine's name)."""
    fa2_problem = InstalledEnvironment().flash_attention_2() if requested == "auto" else None
    choice = choose_attention(requested, fa2_problem)
    padding = "with padding removal" if choice.remove_padding else "without padding removal"
    note = f"rollout engine: {rollout}; actor attention: {choice.implementation}, {padding} ({choice.reason})"
    return [f"{ATTENTION_KEY}={choice.implementation}", f"{REMOVE_PADDING_KEY}={choice.remove_padding}"], note
