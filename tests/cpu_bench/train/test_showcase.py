"""make demo's showcase: the held-out trajectory that shows the skill (right, read from what it retrieved, after a
query naming the question's entity), and a plain note when the model did not search."""

from __future__ import annotations

import json

from cpu_bench.train.summary import example_trajectory

Q = "Question: In which country was Zudom Pongrosko born?\nassistant\n"


def _row(output: str, em: float) -> dict:
    return {"input": Q, "output": output, "gts": {"target": ["Renzesbemia"]}, "em": em, "score": em}


FROM_MEMORY = _row("<answer> Renzesbemia </answer>", 1.0)
LUCKY = _row(
    '<search> some city </search>\n\n<information>Doc 1(Title: "X") nothing here</information>\n\n'
    "<answer> Renzesbemia </answer>",
    1.0,
)
READ = _row(
    '<search> Zudom Pongrosko </search>\n\n<information>Doc 1(Title: "Zudom Pongrosko") born in Bril, a city of '
    "Renzesbemia</information>\n\n<answer> Renzesbemia </answer>",
    1.0,
)
UNNAMED = _row(READ["output"].replace("<search> Zudom Pongrosko </search>", "<search> born where </search>"), 1.0)
WRONG = _row("<search> Zudom Pongrosko </search>\n\n<information>born in Bril</information><answer> Bril </answer>", 0)


def _dump(tmp_path, rows: list[dict]):
    (tmp_path / "6.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return example_trajectory(tmp_path)


def test_the_answer_read_from_a_search_for_the_entity_is_shown(tmp_path):
    shown = _dump(tmp_path, [FROM_MEMORY, LUCKY, UNNAMED, WRONG, READ])
    assert shown.startswith("step 6, question: In which country was Zudom Pongrosko born?")
    assert "<search> Zudom Pongrosko </search>" in shown and "(no held-out" not in shown
    assert "\ngold: Renzesbemia  EM: 1\n" in shown  # the answer, not verl's {"target": [...]} dict


def test_a_right_answer_not_read_from_the_results_says_so(tmp_path):
    shown = _dump(tmp_path, [FROM_MEMORY, LUCKY, WRONG])
    assert "<search> some city </search>" in shown
    assert "(no held-out answer was both right and read from the retrieved text)" in shown


def test_a_model_that_never_searched_is_not_presented_as_searching(tmp_path):
    shown = _dump(tmp_path, [FROM_MEMORY, _row("<answer> Bril </answer>", 0.0)])
    assert "(the model searched on none of the held-out questions: this answer is from memory)" in shown
