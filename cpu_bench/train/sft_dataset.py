"""verl SFT dataset for search trajectories: hermes rows go through verl's ``MultiTurnSFTDataset`` unchanged; native
rows (a ``segments`` column) are laid out token for token as ``search_r1_agent`` lays out a rollout.

Named in verl's SFT config as ``data.custom_cls.path=pkg://cpu_bench.train.sft_dataset`` and
``data.custom_cls.name=SearchSFTDataset``. Invariant for native rows: ``input_ids`` = the chat-templated prompt with
the generation prompt (what the loop sends first) followed by each segment encoded on its own (as the loop encodes
its observations); ``loss_mask`` is 1 exactly on the model's segments.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset, convert_nested_value_to_list_recursive

SEGMENTS_KEY = "segments"


def native_token_layout(tokenizer: Any, prompt: list[dict], segments: list[dict]) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of a native trajectory: prompt (mask 0), then each segment with its ``loss``."""
    ids = list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
    mask = [0] * len(ids)
    for segment in segments:
        piece = tokenizer.encode(segment["text"], add_special_tokens=False)
        ids += piece
        mask += [int(segment["loss"])] * len(piece)
    return ids, mask


class SearchSFTDataset(MultiTurnSFTDataset):
    """``MultiTurnSFTDataset`` plus native Search-R1 rows (requires ``data.pad_mode=no_padding``)."""

    def _segments(self, item: int) -> list[dict]:
        if SEGMENTS_KEY not in self.dataframe.columns:
            return []
        value = convert_nested_value_to_list_recursive(self.dataframe.iloc[item][SEGMENTS_KEY])
        return list(value) if value is not None else []

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        segments = self._segments(item)
        if not segments:
            return super().__getitem__(item)
        if self.pad_mode != "no_padding":
            raise ValueError("SearchSFTDataset lays out native rows for data.pad_mode=no_padding only")
        messages = convert_nested_value_to_list_recursive(self.dataframe.iloc[item][self.messages_key])
        prompt = [m for m in messages if m["role"] != "assistant"]
        ids, mask = native_token_layout(self.tokenizer, prompt, segments)
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise ValueError(f"sequence_length={len(ids)} is larger than self.max_length={self.max_length}")
            ids, mask = ids[: self.max_length], mask[: self.max_length]
        input_ids = torch.tensor(ids, dtype=torch.long)
        return {
            "input_ids": input_ids,
            "position_ids": torch.arange(len(ids), dtype=torch.long),
            "loss_mask": torch.tensor(mask, dtype=torch.long),
        }
