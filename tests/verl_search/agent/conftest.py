"""Fixtures for the agent-loop tests: a real /retrieve server (cpu_bench.testing.stub_retriever on 127.0.0.1), the
real retrieval service with pages for /access (cpu_bench.testing.page_service), the locally trained tokenizer (built
once per session), tool/agent-loop YAMLs pointing at the servers, and Search-R1 rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cpu_bench.testing.page_service import page_service
from cpu_bench.testing.stub_retriever import StubServer
from verl_search.tool.client import RetrievalClient

REPO = Path(__file__).resolve().parents[3]
CORPUS = [
    {"id": "0", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare around 1600.'},
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Danube"\nThe Danube flows through Vienna, Budapest and Belgrade.'},
]
#: the access world: the search hit for Hamlet gives only its url; the answer is in window 2 of its page
HAMLET_URL = "https://en.wikipedia.org/wiki/Hamlet"
ACCESS_CORPUS = [
    {"id": "0", "contents": '"Hamlet"\nHamlet is a tragedy set in Denmark.', "url": HAMLET_URL},
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
]
HAMLET_PARAGRAPHS = [
    f"Paragraph {i} of the Hamlet page. " + " ".join(f"note{i}x{j} on the plot and the staging." for j in range(6))
    for i in range(1, 9)
]
HAMLET_PARAGRAPHS[4] = "The play was written by William Shakespeare around 1600, as the record shows. " * 3
ACCESS_PAGES = [{"url": HAMLET_URL, "title": "Hamlet", "contents": "\n\n".join(HAMLET_PARAGRAPHS)}]
QUESTIONS = {
    "who wrote hamlet?": ["William Shakespeare", "Shakespeare"],
    "what is the capital of france?": ["Paris"],
    "who painted the mona lisa?": ["Leonardo da Vinci"],  # not in the corpus: the oracle reader says "unknown"
}
PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> "
    "query </search> and it will return the top searched results between <information> and </information>. If you "
    "find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>. "
    "Question: {question}\n"
)


class Retriever:
    """The running stub as the tests see it: its /retrieve URL, the queries it received, a switch for HTTP 500."""

    def __init__(self, server: StubServer) -> None:
        self.server = server
        self.url = f"{server.url}/retrieve"

    @property
    def queries(self) -> list[str]:
        return self.server.state.queries

    @property
    def failing(self) -> bool:
        return self.server.state.fault == "500"

    @failing.setter
    def failing(self, value: bool) -> None:
        self.server.state.set_fault("500" if value else "ok")


@pytest.fixture(scope="session")
def retriever_server():
    with StubServer(CORPUS) as server:
        yield Retriever(server)


@pytest.fixture
async def retriever(retriever_server):
    """The shared stub, answering normally with no recorded queries; HTTP sessions closed after the test."""
    retriever_server.queries.clear()
    retriever_server.failing = False
    yield retriever_server
    retriever_server.failing = False
    await RetrievalClient.close_all()


@pytest.fixture
def tool_yaml(retriever, tmp_path) -> Path:
    """The repo's tool_config/search_tool_config.yaml with its URL pointed at the stub (fast failure settings)."""
    config = yaml.safe_load((REPO / "tool_config" / "search_tool_config.yaml").read_text())
    config["tools"][0]["config"].update(retrieval_service_url=retriever.url, timeout=5.0, max_attempts=1)
    path = tmp_path / "search_tool_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def make_row(question: str, agent_name: str, index: int = 0) -> dict:
    """A row in the preprocessed (RLHFDataset) form of DESIGN §3.5."""
    return {
        "data_source": "searchR1_nq",
        "prompt": [{"role": "user", "content": PROMPT.format(question=question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": QUESTIONS[question]}},
        "extra_info": {
            "index": index,
            "split": "test",
            "question": question,
            "need_tools_kwargs": True,
            "tools_kwargs": {"search": {"create_kwargs": {}}},
        },
        "agent_name": agent_name,
    }


@pytest.fixture
def rows():
    return make_row


@pytest.fixture
def oracle():
    """ORACLE READER over the test questions: the gold answer if retrieved, else "unknown"."""
    from cpu_bench.testing.scripted_policy import OracleReader

    return OracleReader(QUESTIONS)


@pytest.fixture(scope="session")
def page_service_server(tmp_path_factory):
    with page_service(tmp_path_factory.mktemp("pages"), ACCESS_CORPUS, ACCESS_PAGES) as server:
        yield server


@pytest.fixture
async def pages(page_service_server):
    """The service with pages; the loop's HTTP sessions (search and access) closed after the test."""
    yield page_service_server
    await RetrievalClient.close_all()


@pytest.fixture
def access_tool_yaml(pages, tmp_path) -> Path:
    """The repo's tool_config/search_access_tool_config.yaml aimed at the service (smallest window, fast failures)."""
    config = yaml.safe_load((REPO / "tool_config" / "search_access_tool_config.yaml").read_text())
    search, access = config["tools"]
    search["config"].update(retrieval_service_url=pages.url, timeout=5.0, max_attempts=1)
    access["config"].update(retrieval_service_url=pages.url, timeout=5.0, max_attempts=1, max_result_chars=1000)
    path = tmp_path / "search_access_tool_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
