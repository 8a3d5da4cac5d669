"""The locally trained tokenizer: built once per cache folder, one token per piece of Qwen chat markup."""

from __future__ import annotations

from cpu_bench.train.local_tokenizer import ensure_tokenizer_dir


def test_tokenizer_dir_is_built_once_and_renders_qwen_markup(tokenizer_dir, tokenizer):
    assert ensure_tokenizer_dir(tokenizer_dir.parent) == tokenizer_dir  # cached, not rebuilt
    for token in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tokenizer.encode("\n", add_special_tokens=False) != []
    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "search", "arguments": {"query_list": ["q"]}}}
                ],
            },
            {"role": "tool", "content": "Doc 1"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["q"]}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
