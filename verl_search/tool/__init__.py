"""The tools verl's rollout workers run: ``SearchTool`` and ``AccessTool`` (pages read in windows) over one HTTP
machinery (config, transport, cache, limits and endpoints, arguments, formatting, failure texts, statistics).

Runtime code, imported inside every agent-loop worker: it may import verl, aiohttp, pydantic and the shared leaves
(``verl_search.errors``, ``verl_search.protocol``); never ``launch``, ``eval``, ``cpu``, nor the retrieval service.
"""
