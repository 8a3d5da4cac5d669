"""The web-search backend: a search provider's API (``providers``) behind /retrieve, answers kept in a durable SQLite
cache (``cache``), live calls limited by a per-run budget and a shared rate (``limits``), made with retries by
``caller`` and served to the engine by ``backend.WebSearch`` (its errors: ``errors``; its settings: ``settings``,
which ``config.ServerConfig`` extends); the pages of POST /access, fetched from the public internet by ``fetch`` (its
errors: ``fetch_errors``; HTML to text: ``html_text``) and kept in the same cache (``access``). ``settings`` imports
nothing of ours; the rest may import the service's ``errors``, ``verl_search.pacing``, and the service's ``config``
for typing only; the engine imports
it lazily, for ``--backend web``."""
