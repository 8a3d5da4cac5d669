"""The base model shipped in the repository, so a new machine's ``make demo`` and ``make train`` skip the longest stage.

The base model (:mod:`cpu_bench.train.base_model`) takes 10-17 minutes to build on two CPU cores; it is built from
the code and the default settings alone (other toy worlds, fixed seeds), so the repository ships the one the code
builds: ``shipped_base_model/`` holds the stage folder as the build wrote it (weights, tokenizer, ``stage.json`` with
the stage's key) and ``manifest.json``, which records how it was made and what it scores:

- ``key``: the base-model stage's key (settings, prompt rendering, the stages below it). A run restores the shipped
  model only when its own key is this one, so a run with other settings builds its own.
- ``recipe``: a digest of the source of every module the build runs (docstrings and comments left out). A test fails
  when it differs from the code's, naming ``make base-model UPDATE=1``.
- ``weights_sha256`` and ``tokenizer``: the files' fingerprints. The tokenizer the code learns now must equal the
  shipped one; a run checks this before restoring.
- ``heldout``: the mean next-token loss on the trained tokens of a toy world no stage trains on. Floats differ from
  one CPU to another, and so do the weights of a rebuild, so ``make base-model``
  (:mod:`cpu_bench.train.base_rebuild`) compares a rebuild with the shipped model by hash where the CPU gives the
  same floats and else by this score.

Invariant: the shipped folder is only read; a run copies it into its own folder and marks nothing as built that the
key does not match.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cpu_bench.train.base_model import base_stage, initial_stage, world_rows
from cpu_bench.train.config import TrainConfig
from cpu_bench.train.sft_data import RowSettings
from cpu_bench.train.stage import MARKER, normalised, read_marker
from verl_search.atomic import atomic_path
from verl_search.errors import VerlSearchError

logger = logging.getLogger(__name__)

SHIPPED = Path(__file__).resolve().parent / "shipped_base_model"
MANIFEST = "manifest.json"
#: the modules whose code decides what the base model is (its recipe): the stages, the other worlds and their
#: questions, how a trajectory is rendered and tokenised; their source, less docstrings and comments, is digested
#: into the manifest (the prompt templates' text and the tool's schemas are in the stage key already)
RECIPE_MODULES = (
    "cpu_bench.train.base_model",
    "cpu_bench.train.pretrain",
    "cpu_bench.train.initial_model",
    "cpu_bench.train.tiny_model",
    "cpu_bench.train.local_tokenizer",
    "cpu_bench.train.other_worlds",
    "cpu_bench.train.questions",
    "cpu_bench.train.sft_data",
    "cpu_bench.train.sft_dataset",
    "verl_search.data.rows",
    "verl_search.data.templates",
    "verl_search.protocol",
    "verl_search.tool.formatting",
    "local_dense_retriever.toy.world",
    "local_dense_retriever.toy.vocab",
    "local_dense_retriever.toy.questions",
    "local_dense_retriever.toy.corpus",
)
#: how many trajectories of the held-out world are scored
HELDOUT_ROWS = 256


class ShippedBaseError(VerlSearchError):
    """The shipped base model does not match what the code builds (or cannot be read)."""


@dataclass(frozen=True)
class Manifest:
    key: dict[str, Any]
    recipe: str
    weights_sha256: str
    tokenizer: str
    heldout: dict[str, Any]  # {"world", "rows", "loss"}
    built: dict[str, Any]  # {"cpu", "float_path", "torch", "transformers", "seconds", "date"}

    @property
    def float_path(self) -> str | None:
        """The float path that built the model (:func:`float_path`), where the manifest names it."""
        return self.built.get("float_path")

    @classmethod
    def read(cls, folder: Path = SHIPPED) -> Manifest:
        try:
            return cls(**json.loads((folder / MANIFEST).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as e:
            raise ShippedBaseError(f"cannot read the shipped base model's manifest {folder / MANIFEST}: {e}") from e

    def write(self, folder: Path) -> None:
        with atomic_path(folder / MANIFEST) as tmp:
            tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _source_without_docs(source: str) -> str:
    """``source`` parsed and printed back without docstrings (and so without comments or formatting)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def recipe_digest() -> str:
    """The digest of the code of :data:`RECIPE_MODULES` (a docstring or comment edit does not change it)."""
    h = hashlib.sha256()
    for name in RECIPE_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ShippedBaseError(f"recipe module {name} not found")
        h.update(name.encode() + b"\0" + _source_without_docs(Path(spec.origin).read_text(encoding="utf-8")).encode())
    return h.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_fingerprint(folder: Path) -> str:
    """The digest of a model folder's tokenizer: its vocabulary, merges and added tokens (not how it is saved)."""
    blob = json.loads((Path(folder) / "tokenizer.json").read_text(encoding="utf-8"))
    model = blob.get("model", {})
    parts = [model.get("vocab"), model.get("merges"), [t.get("content") for t in blob.get("added_tokens", [])]]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def heldout_world(config: TrainConfig) -> int:
    """The toy world the held-out score reads: the first one after every world a stage trains on."""
    return config.world.world_seed + max(config.pretrain.task_worlds, 1) + 1


def heldout_loss(model_dir: Path, config: TrainConfig, rows: RowSettings, cache_dir: Path) -> dict[str, Any]:
    """``{"world", "rows", "loss"}``: the model's mean next-token loss (nats) on the trained tokens of the first
    :data:`HELDOUT_ROWS` trajectories of :func:`heldout_world`."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from cpu_bench.train.pretrain import padded

    world = heldout_world(config)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trajectories = world_rows(config, rows, tokenizer, world, cache_dir)[:HELDOUT_ROWS]
    model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa").eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(trajectories), 16):
            ids, mask, attention = padded(trajectories[start : start + 16], tokenizer.pad_token_id)
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
            scored = mask[:, 1:] > 0
            losses = torch.nn.functional.cross_entropy(logits[scored], ids[:, 1:][scored], reduction="sum")
            total, tokens = total + float(losses), tokens + int(scored.sum())
    return {"world": world, "rows": len(trajectories), "loss": round(total / max(tokens, 1), 5)}


def usable(config: TrainConfig, rows: RowSettings, out: Path, folder: Path = SHIPPED) -> Manifest | None:
    """The manifest of the shipped model when it is the one ``config`` would build in ``out`` (same stage key),
    else None."""
    marker = read_marker(folder / "base_model")
    if marker is None or not (folder / MANIFEST).is_file():
        return None
    if marker.get("key") != normalised(base_stage(config, rows, out).key):
        return None
    return Manifest.read(folder)


def restore(config: TrainConfig, rows: RowSettings, out: Path, folder: Path = SHIPPED) -> bool:
    """Copy the shipped base model into the run folder ``out`` when the folder has none and the shipped one is what
    ``config`` builds with this code (its key and recipe), its weights are the manifest's, and the tokenizer learnt
    here (the initial model, built first: seconds) is the shipped one; returns whether it restored. Anything else
    is logged and the run builds its own."""
    if not config.pretrain.enabled or base_stage(config, rows, out).done() is not None:
        return False
    manifest = usable(config, rows, out, folder)
    if manifest is None:
        return False
    if recipe_digest() != manifest.recipe:
        logger.warning("the code that builds the base model changed since the shipped one was built: building it")
        return False
    if file_sha256(folder / "base_model" / "model.safetensors") != manifest.weights_sha256:
        logger.warning("the shipped base model's weights are not the manifest's (%s): building it instead", folder)
        return False
    initial = initial_stage(config, rows, out)
    initial.ensure()
    if tokenizer_fingerprint(initial.folder) != manifest.tokenizer:
        logger.warning(
            "the shipped base model's tokenizer is not the one learnt here (%s): building the base model instead",
            initial.folder,
        )
        return False
    target = out / "base_model"
    shutil.rmtree(target, ignore_errors=True)
    with atomic_path(target) as tmp:
        shutil.copytree(folder / "base_model", tmp)
    logger.info(
        "base model: the one shipped in the repository (%s; built on %s, held-out loss %.3f); "
        "make base-model rebuilds it from the code",
        folder,
        manifest.float_path or manifest.built.get("cpu", "?"),
        manifest.heldout["loss"],
    )
    return True


def check_files(folder: Path = SHIPPED) -> Manifest:
    """Raise ShippedBaseError unless the shipped folder's weights, tokenizer and recipe are the manifest's."""
    manifest = Manifest.read(folder)
    weights = file_sha256(folder / "base_model" / "model.safetensors")
    if weights != manifest.weights_sha256:
        raise ShippedBaseError(f"{folder}: model.safetensors has sha256 {weights}, not the manifest's")
    if tokenizer_fingerprint(folder / "base_model") != manifest.tokenizer:
        raise ShippedBaseError(f"{folder}: the tokenizer is not the one the manifest names")
    recipe = recipe_digest()
    if recipe != manifest.recipe:
        raise ShippedBaseError(
            f"the code that builds the base model changed since the shipped one was built (recipe {manifest.recipe}, "
            f"now {recipe}): run `make base-model UPDATE=1` (about 10-17 minutes on 2 cores) and commit "
            f"{folder.name}/"
        )
    if (read_marker(folder / "base_model") or {}).get("key") != manifest.key:
        raise ShippedBaseError(f"{folder}: base_model/{MARKER} does not hold the manifest's key")
    return manifest


def rows_for(config: TrainConfig, out: Path) -> RowSettings:
    """How rows are rendered for ``config``, with a tool YAML written under ``out`` (the URL is not part of a row)."""
    from cpu_bench.train.data_stage import row_settings, write_tool_yaml

    out.mkdir(parents=True, exist_ok=True)
    return row_settings(config, write_tool_yaml(config, "http://127.0.0.1:8000/retrieve", out / "search_tool.yaml"))
