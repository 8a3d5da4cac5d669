"""How a page is cut into windows: each fits the cap with its header and hint, cuts fall on paragraph, line or word
breaks, nothing is lost, and long pages get as many window numbers as they need."""

from __future__ import annotations

import json

from verl_search.tool.windows import EMPTY, cut, windows
from verl_search.tool.wire import Page

URL = "https://example.org/a-page"


def test_cuts_prefer_paragraphs_then_lines_then_words():
    p, q, r = ("pp " * 100).strip(), ("qq " * 100).strip(), ("rr\n" * 100).strip()  # words and lines inside
    assert cut(f"{p}\n\n{q}\n\n{r}", 700) == [f"{p}\n\n{q}", r]
    a, b, c = ("aa " * 100).strip(), ("bb " * 100).strip(), ("cc " * 100).strip()
    assert cut(f"{a}\n{b}\n{c}", 700) == [f"{a}\n{b}", c]
    words = " ".join(["w" * 9] * 100)  # 999 characters of 9-letter words
    pieces = cut(words, 100)
    assert all(len(p) <= 100 and not p.startswith(" ") for p in pieces)
    assert " ".join(pieces) == words  # no word cut in two


def test_a_word_longer_than_a_window_is_cut_hard():
    assert cut("x" * 2500, 1000) == ["x" * 1000, "x" * 1000, "x" * 500]


def test_every_window_fits_the_cap_and_names_the_next_call():
    text = "\n\n".join(f"Paragraph {i}. " + "word " * (20 + i % 50) for i in range(400))
    shown = windows(Page(url=URL, title="A page", contents=text), URL, 1000)
    total = len(shown)
    assert total > 99  # three-digit window numbers: the header and hint grew, still within the cap
    assert all(len(w) <= 1000 for w in shown)
    assert shown[0].startswith(f"[page 1 of {total}] A page\nParagraph 0.")
    hint = shown[41].rsplit("read the next with access ", 1)[1].rstrip("]")
    assert json.loads(hint) == {"url": URL, "page": 43}
    assert "read the next" not in shown[-1]
    assert windows(Page(url=URL, title="A page", contents=text), URL, 1000) == shown  # stable page numbers


def test_an_empty_page_is_one_window_saying_so():
    assert windows(Page(url=URL, title="Blank", contents="  \n "), URL, 1000) == [f"[page 1 of 1] Blank\n{EMPTY}"]
