"""The search tool verl's rollout workers run: ``SearchTool`` and its HTTP client (config, arguments, limits and
endpoints, formatting, statistics).

Runtime code, imported inside every agent-loop worker: it may import verl, aiohttp, pydantic and the shared leaves
(``verl_search.errors``, ``verl_search.protocol``); never ``launch``, ``eval``, ``cpu``, nor the retrieval service.
"""
