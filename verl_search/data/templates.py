"""Named prompt templates from ``prompt.yaml``: validated once, rendered by literal ``{question}`` substitution.

Rendering never uses ``str.format``, so templates may show JSON (``{"name": "search", ...}``) verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from verl_search.data.errors import TemplateError

QUESTION_SLOT = "{question}"


class PromptTemplate(BaseModel):
    """One way of asking the question: chat messages plus the agent loop that must run them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field(description="What the template is for; shown by --list_templates.")
    agent_name: str = Field(
        min_length=1,
        description="verl agent loop written into each row's agent_name (tool_agent or search_r1_agent).",
    )
    system: str | None = Field(default=None, description="System message text; null sends no system message.")
    user: str = Field(min_length=1, description="User message text; must contain {question} exactly once.")

    @model_validator(mode="after")
    def _one_question_slot(self) -> PromptTemplate:
        if self.user.count(QUESTION_SLOT) != 1:
            raise ValueError(f"user text must contain {QUESTION_SLOT} exactly once")
        if self.system is not None and QUESTION_SLOT in self.system:
            raise ValueError(f"system text must not contain {QUESTION_SLOT}")
        return self

    def render(self, question: str) -> list[dict[str, str]]:
        """Chat messages for ``question`` (system first when the template has one)."""
        messages = []
        if self.system is not None:
            messages.append({"role": "system", "content": self.system})
        messages.append({"role": "user", "content": self.user.replace(QUESTION_SLOT, question)})
        return messages


class TemplateFile(BaseModel):
    """The whole ``prompt.yaml``: a default name and the named templates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: str = Field(description="Template used when --template is not given.")
    templates: dict[str, PromptTemplate] = Field(min_length=1, description="Templates by name.")

    @model_validator(mode="after")
    def _default_exists(self) -> TemplateFile:
        if self.default not in self.templates:
            raise ValueError(f"default template {self.default!r} is not defined (have {sorted(self.templates)})")
        return self

    def get(self, name: str | None) -> tuple[str, PromptTemplate]:
        """The template called ``name`` (the default when None), with its resolved name."""
        chosen = self.default if name is None else name
        if chosen not in self.templates:
            raise TemplateError(f"unknown template {chosen!r}; choose one of {sorted(self.templates)}")
        return chosen, self.templates[chosen]


def find_template_file(path: str | Path, folders: Sequence[Path] = ()) -> Path:
    """``path`` as given when it is absolute or names a file from the working directory, else the first of
    ``folders`` holding it (a script's own folder, so ``--config prompt.yaml`` works from anywhere); raises
    TemplateError naming every place looked when none has it."""
    path = Path(path).expanduser()
    places = [path] if path.is_absolute() else [Path.cwd() / path, *(Path(f) / path for f in folders)]
    for place in places:
        if place.is_file():
            return place
    raise TemplateError(f"template file {path} not found (looked for {', '.join(map(str, dict.fromkeys(places)))})")


def load_templates(path: str | Path) -> TemplateFile:
    """Read and validate a prompt.yaml; any problem raises TemplateError naming the file and key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TemplateError(f"cannot read template file {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise TemplateError(f"template file {path} is not valid YAML: {e}") from e
    try:
        return TemplateFile.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<top level>"
        raise TemplateError(f"template file {path}: {where}: {first['msg']}") from e
