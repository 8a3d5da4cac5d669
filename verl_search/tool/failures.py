"""The one boundary where a tool call's typed errors become the text the model reads, for every tool of ours:
``[<tool> failed: <kind>] what happened. what to do`` and ``[<tool> error: invalid arguments] <message>``.

Invariant: the label's kind is the error's ``kind`` (the counters' name too), and a failure never reads like an empty
result.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_search.errors import BudgetSpent, InvalidArguments, NotCached, PageNotFound, SearchError

AFTER_FAILURE = "This is a tool failure, not an empty result: retry later or answer with what you know."


@dataclass(frozen=True)
class Wording:
    """How one tool's failure texts name the tool, its service and what will not help."""

    tool: str  # the label's name: "search" -> "[search failed: ...]"
    service: str  # the subject of what happened: "The search engine"
    again: str  # what a final failure says will not help: "searching again"
    not_recorded: str  # NotCached's sentence
    not_found: str = "Nothing is stored under this name."  # PageNotFound's sentence and advice

    def after_final(self) -> str:
        return f"This is a tool failure, not an empty result: {self.again} will not help; answer with what you know."


SEARCH = Wording(
    tool="search",
    service="The search engine",
    again="searching again",
    not_recorded="The search engine replays recorded searches offline and this search was not recorded.",
)
ACCESS = Wording(
    tool="access",
    service="The page service",
    again="opening it again",
    not_recorded="The page service replays recorded pages offline and this page was not recorded.",
    not_found="No page is stored under this url. Open a url that a search result gives, or search instead.",
)


def failure_text(error: SearchError, wording: Wording, *, timeout: float) -> str:
    """The stable text the model sees for a failed call (``timeout``: the call's deadline in seconds)."""
    if isinstance(error, InvalidArguments):
        return f"[{wording.tool} error: invalid arguments] {error}"
    label = f"[{wording.tool} failed: {error.kind}]"
    if isinstance(error, PageNotFound):
        return f"{label} {wording.not_found}"
    what = {
        "timeout": f"{wording.service} did not answer within {timeout:g} s.",
        "unavailable": f"{wording.service} could not be reached.",
        "rejected": f"{wording.service} refused the request.",
        "server_error": f"{wording.service} had an internal error.",
        "bad_response": f"{wording.service} sent an unreadable reply.",
        "budget": "The search budget of this run is spent.",
    }.get(error.kind, f"The {wording.tool} failed.")
    if isinstance(error, NotCached):
        what = wording.not_recorded
    after = wording.after_final() if isinstance(error, (BudgetSpent, NotCached)) else AFTER_FAILURE
    return f"{label} {what} {after}"


def internal_text(error: Exception, wording: Wording) -> str:
    """The text for a bug of ours inside a call (logged loudly where it is caught)."""
    return f"[{wording.tool} failed: internal] {type(error).__name__}. {AFTER_FAILURE}"
