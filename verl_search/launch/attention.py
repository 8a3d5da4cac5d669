"""The actor's attention implementation and the padding removal that goes with it, chosen by one rule for every run
script: ``auto`` takes FlashAttention-2 when transformers' own availability check passes, else PyTorch's ``sdpa``;
verl's padding removal (sequences packed into one row) is switched on only with a FlashAttention kernel, whose
variable-length path keeps packed sequences apart.

CLI (what ``common.sh``'s ``vs_rollout_overrides`` calls): ``python -m verl_search.launch.attention REQUESTED`` prints
the two verl overrides, one per line, then a line saying why.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

#: verl's attention when ``override_config.attn_implementation`` is unset
VERL_DEFAULT = "flash_attention_2"
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

    def overrides(self) -> list[str]:
        return [f"{ATTENTION_KEY}={self.implementation}", f"{REMOVE_PADDING_KEY}={self.remove_padding}"]


def flash_attention_2_problem() -> str | None:
    """None when transformers reports FlashAttention-2 usable here (package, version and a CUDA device), else why
    not, in a few words (without flash_attn's package there is nothing to ask: transformers is not imported)."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed"
    try:
        from transformers.utils import is_flash_attn_2_available
    except ImportError as e:
        return f"transformers does not import ({e})"
    if is_flash_attn_2_available():
        return None
    return "transformers finds no usable FlashAttention-2 (a flash_attn without FA2 kernels, or no CUDA device)"


def choose_attention(requested: str, fa2_problem: str | None) -> AttentionChoice:
    """``requested`` (``auto`` or a transformers name) resolved with ``fa2_problem`` (see above)."""
    if requested == "auto":
        if fa2_problem is None:
            return AttentionChoice(VERL_DEFAULT, True, "transformers finds FlashAttention-2")
        return AttentionChoice("sdpa", False, f"no FlashAttention-2: {fa2_problem}")
    return AttentionChoice(requested, requested in PACKING_KERNELS, "set by ATTN_IMPLEMENTATION")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_search.launch.attention", description=__doc__.split("\n")[0])
    p.add_argument("requested", help="auto, or an attention implementation transformers knows (sdpa, eager, ...)")
    args = p.parse_args(argv)
    choice = choose_attention(args.requested, flash_attention_2_problem() if args.requested == "auto" else None)
    padding = "with padding removal" if choice.remove_padding else "without padding removal"
    print("\n".join([*choice.overrides(), f"{choice.implementation}, {padding} ({choice.reason})"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
