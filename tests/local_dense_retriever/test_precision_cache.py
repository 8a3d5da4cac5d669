"""The precision probes' cache: what was measured comes back for the same key only, a foreign entry is measured anew,
and the file stays bounded however many model copies (temporary folders, as tests make) were probed."""

from __future__ import annotations

import json

from local_dense_retriever import precision_cache
from local_dense_retriever.precision_cache import FILE_NAME, MAX_ENTRIES, cached_timings, remember


def test_timings_come_back_by_key_and_names(tmp_path):
    remember("bf16", {"float32": 0.12, "bfloat16": 0.05}, tmp_path)
    remember("race", {"int8": 0.06, "auto": 0.11}, tmp_path)
    assert cached_timings("bf16", tmp_path) == {"float32": 0.12, "bfloat16": 0.05}
    assert cached_timings("race", tmp_path, names=("int8", "auto")) == {"int8": 0.06, "auto": 0.11}
    assert cached_timings("race", tmp_path) is None  # an entry without the asked timings is measured anew
    assert cached_timings("other", tmp_path) is None


def test_the_file_keeps_the_newest_probes_only(tmp_path):
    for i in range(MAX_ENTRIES + 6):  # model-copy-0 .. -69: the first six dropped
        remember(f"model-copy-{i}", {"float32": 0.1, "bfloat16": 0.05}, tmp_path)
    remember("model-copy-6", {"float32": 0.2, "bfloat16": 0.05}, tmp_path)  # the oldest kept, measured again: newest
    remember("another", {"float32": 0.1, "bfloat16": 0.05}, tmp_path)  # so this one drops model-copy-7
    probes = json.loads((tmp_path / FILE_NAME).read_text())["probes"]
    assert len(probes) == MAX_ENTRIES
    assert "model-copy-5" not in probes and "model-copy-7" not in probes
    assert list(probes)[-2:] == ["model-copy-6", "another"]
    assert cached_timings("model-copy-6", tmp_path)["float32"] == 0.2
    assert precision_cache.FORMAT == json.loads((tmp_path / FILE_NAME).read_text())["format"]
