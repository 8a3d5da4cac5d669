"""Model-facing text: Search-R1's ``Doc i(Title: T) text`` format, one block per query, capped, never JSON."""

from __future__ import annotations

from verl_search.protocol import Document
from verl_search.tool.formatting import format_passages, format_results


def doc(contents: str, **extra) -> Document:
    return Document(id="1", contents=contents, **extra)


def test_wiki18_contents_become_doc_lines_with_quoted_titles():
    text = format_passages([doc('"Paul Walker"\nAn actor.\nBorn 1973.'), doc('"Fast Five"\nA film.')])
    assert text == 'Doc 1(Title: "Paul Walker") An actor. Born 1973.\nDoc 2(Title: "Fast Five") A film.'


def test_separate_title_field_and_title_less_contents():
    assert format_passages([doc("Body only.")]) == "Doc 1(Title: ) Body only."
    assert format_passages([doc("Body.", title="T")]) == "Doc 1(Title: T) Body."


def test_no_hits_is_said_plainly():
    assert format_results(["q"], [[]], max_chars=1000) == "No documents found."


def test_several_queries_are_labelled_and_share_the_budget():
    long = doc('"Long"\n' + "word " * 2000)
    text = format_results(["first", "second"], [[long], [doc('"Short"\nBrief.')]], max_chars=1000)
    assert len(text) <= 1000
    assert 'Results for query 1 "first":\nDoc 1(Title: "Long")' in text
    assert 'Results for query 2 "second":\nDoc 1(Title: "Short") Brief.' in text
    assert "...(truncated)" in text


def test_single_query_text_is_capped():
    text = format_results(["q"], [[doc('"T"\n' + "x" * 10_000)]], max_chars=500)
    assert len(text) == 500 and text.endswith("...(truncated)")


def test_notes_are_prefixed():
    text = format_results(["q"], [[doc('"T"\nx')]], max_chars=500, notes=["query 1 was cut to 8 characters"])
    assert text.startswith('[note: query 1 was cut to 8 characters]\nDoc 1(Title: "T") x')


def test_a_title_field_repeated_in_contents_shows_once():
    quoted = doc('"Paris"\nParis is the capital of France.', title="Paris", url="https://en.wikipedia.org/wiki/Paris")
    plain = doc("Paris\nParis is the capital of France.", title="Paris")
    other = doc('"Lutetia"\nThe Roman city.', title="Paris")
    assert format_passages([quoted]) == "Doc 1(Title: Paris) Paris is the capital of France."
    assert format_passages([plain]) == "Doc 1(Title: Paris) Paris is the capital of France."
    assert format_passages([other]) == 'Doc 1(Title: Paris) "Lutetia" The Roman city.'


def test_show_urls_names_each_hit_url_and_leaves_hits_without_one_as_before():
    with_url = doc('"Paris"\nThe capital.', url="https://en.wikipedia.org/wiki/Paris")
    without = doc('"Lyon"\nA city.')
    text = format_results(["q"], [[with_url, without]], max_chars=1000, show_urls=True)
    assert text.splitlines() == [
        'Doc 1(Title: "Paris")(URL: https://en.wikipedia.org/wiki/Paris) The capital.',
        'Doc 2(Title: "Lyon") A city.',
    ]
    assert format_results(["q"], [[with_url]], max_chars=1000) == 'Doc 1(Title: "Paris") The capital.'
