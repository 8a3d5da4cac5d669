"""The CPU rollout server (a Ray actor per replica): serves the agent loop's token-in/token-out ``generate`` from a
transformers copy of the policy, batching requests that arrive together, and takes the actor's weights each step.

Invariant: generation and weight updates never overlap (one lock); every request gets a result or its exception;
``abort_all_requests`` ends every unfinished request as ``aborted`` with the tokens it has (verl resends it with them)
and holds new ones until ``resume_generation``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import torch

from verl_search.cpu.options import CpuRolloutOptions
from verl_search.cpu.sampler import BatchSampler, SampleRequest

logger = logging.getLogger(__name__)

#: what the server never reads from sampling params (``logprobs``: ``generate`` answers it)
_IGNORED_PARAMS = ("include_stop_str_in_output", "no_stop_trim", "seed", "skip_special_tokens", "logprobs")


class CpuRolloutServer:
    """Loads the policy from the model path; ``generate`` matches verl's vLLM/SGLang servers' signature."""

    def __init__(
        self, config: Any, model_path: str, replica_rank: int, options: dict, trust_remote_code: bool = False
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.fs import copy_to_local

        self.config = config
        self.replica_rank = replica_rank
        self.options = CpuRolloutOptions(**options)
        path = copy_to_local(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32, attn_implementation="sdpa", trust_remote_code=trust_remote_code
        ).eval()
        eos = {self.tokenizer.eos_token_id}
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        eos.update(configured if isinstance(configured, list) else [configured])
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.sampler = BatchSampler(self.model, self.tokenizer, [e for e in eos if e is not None], pad)
        self.max_model_len = config.max_model_len or (config.prompt_length + config.response_length)
        self.global_steps: int | None = None
        self._lock = asyncio.Lock()
        self._pending: list[tuple[SampleRequest, asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._abort = threading.Event()  # read by the sampler thread after every decoding step
        self._open = asyncio.Event()  # set while generation is allowed (cleared by abort_all_requests)
        self._open.set()
        self._reject = False

    async def ready(self) -> bool:
        return True

    def _request(self, prompt_ids: list[int], params: dict[str, Any]) -> SampleRequest:
        params = dict(params)
        for key in _IGNORED_PARAMS:
            params.pop(key, None)
        if float(params.pop("repetition_penalty", 1.0)) != 1.0:
            logger.warning("repetition_penalty is not supported by the CPU rollout server; ignored")
        budget = self.max_model_len - len(prompt_ids)
        if budget < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room within {self.max_model_len}")
        default = min(self.config.response_length, budget)
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", default))
        max_tokens = max(1, min(int(max_tokens), budget))
        if self.options.max_tokens_per_turn is not None:
            max_tokens = min(max_tokens, self.options.max_tokens_per_turn)
        stop = params.pop("stop", None) or ()
        request = SampleRequest(
            prompt_ids=list(prompt_ids),
            max_tokens=max_tokens,
            temperature=float(params.pop("temperature", 1.0)),
            top_p=float(params.pop("top_p", 1.0)),
            top_k=int(params.pop("top_k", -1)),
            stop=[stop] if isinstance(stop, str) else list(stop),
            stop_token_ids=list(params.pop("stop_token_ids", None) or ()),
            ignore_eos=bool(params.pop("ignore_eos", False)),
        )
        if params:
            logger.warning("CPU rollout server ignores sampling params %s", sorted(params))
        return request

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None:
            raise ValueError("the CPU rollout server serves text-only models")
        want_log_probs = bool(sampling_params.get("logprobs", False))
        if not self._open.is_set():
            if self._reject:
                raise RuntimeError(f"rollout server {self.replica_rank} is paused and rejects new requests")
            await self._open.wait()
        request = self._request(prompt_ids, sampling_params)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._ensure_loop()
        self._wakeup.set()
        result, weights_version = await future  # the version of the weights that wrote these tokens
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs if want_log_probs else None,
            stop_reason="aborted" if result.stop_reason == "aborted" else "completed",
            extra_fields={"global_steps": weights_version},
        )

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._wakeup = asyncio.Event()
            self._loop_task = asyncio.create_task(self._batch_loop())

    async def _batch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(self.options.batch_window_ms / 1000.0)  # let requests sent together arrive
            while self._pending:
                batch = self._pending[: self.options.max_batch_size]
                del self._pending[: len(batch)]
                try:
                    async with self._lock:
                        version = self.global_steps
                        results = await asyncio.to_thread(
                            self.sampler.generate, [r for r, _ in batch], self._abort.is_set
                        )
                except Exception as e:  # every waiting request learns why
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(e)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result((result, version))

    async def update_weights(self, named_tensors: dict[str, torch.Tensor], global_steps: int | None = None) -> dict:
        """Copy the actor's full (HF-named) tensors into the served model; returns the seconds it took."""
        start = time.perf_counter()
        async with self._lock:
            own = self.model.state_dict()
            unknown = sorted(set(named_tensors) - set(own))
            if unknown:
                raise KeyError(f"the actor sent weights the served model lacks: {unknown[:5]}")
            with torch.no_grad():
                for name, tensor in named_tensors.items():
                    own[name].copy_(tensor.to(own[name].dtype))
            self.global_steps = global_steps
        return {"seconds": time.perf_counter() - start}

    async def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    # the memory and profiling calls verl makes on every server: nothing to free, pause or profile on a CPU
    sleep = wake_up = clear_kv_cache = release_kv_cache = resume_kv_cache = start_profile = stop_profile = _nothing

    async def abort_all_requests(self, reject_request: bool = False) -> dict:
        """Pause: the running batch ends at its next token as ``aborted``, queued requests end at once (no tokens),
        and new requests wait for :meth:`resume_generation` (or fail, with ``reject_request``)."""
        from verl_search.cpu.sampler import SampleResult

        self._open.clear()
        self._reject = reject_request
        self._abort.set()
        queued, self._pending = self._pending, []
        for _, future in queued:
            if not future.done():
                future.set_result((SampleResult([], [], "aborted"), self.global_steps))
        async with self._lock:  # the running batch has stopped once the lock is free
            pass
        return {"aborted_count": len(queued), "request_ids": []}

    async def resume_generation(self) -> None:
        """Accept and run requests again (the aborted ones come back with their tokens so far)."""
        self._abort.clear()
        self._reject = False
        self._open.set()
