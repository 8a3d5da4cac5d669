"""The fleet seen as one service: GET /health and GET /metrics of every replica (as each last reported them to the
board) combined into the single server's bodies, plus the list of replicas; ``FleetViewApp`` answers them in front of
whichever app takes the fleet's HTTP (the gateway, or each replica when there is none).

Invariants: ``fleet_health``/``fleet_metrics`` are pure functions of the reports; every key of the single server's
bodies keeps its meaning and shape (counters are the fleet's totals), so a client of one server reads a fleet
unchanged. What cannot be summed is said: ``uptime_s`` is the oldest replica's, ``latency_ms`` percentiles the
slowest replica's (an upper bound of the fleet's), ``mean_batch_size`` the mean over every replica's batches, ``gpus``
every replica's entries (a GPU that replicas share appears once per replica, under the same uuid); in the ``web``
block, what the replicas read from their shared cache file (cached answers and pages, the run's calls and spend) is
the largest replica's figure and the hit rate that of the summed lookups.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from local_dense_retriever.wire import error_response

logger = logging.getLogger(__name__)

#: what the fleet's /health says before any replica has reported (its status code is 503)
NO_REPORT = {"status": "loading", "detail": "no retriever replica has reported yet"}


def fleet_health(replicas: Mapping[str, Mapping[str, Any]]) -> tuple[dict, int]:
    """(body, status code) of the fleet's /health: 200 when at least one replica is ready. ``replicas`` maps each
    replica's id to its last report (``health``, ``healthy``, ``age_s``)."""
    ready = [r for r in replicas.values() if r.get("healthy")]
    if not replicas:
        return dict(NO_REPORT), 503
    base = dict((ready or list(replicas.values()))[0]["health"])
    base["status"] = "ready" if ready else base.get("status", "unavailable")
    base["detail"] = f"{len(ready)} of {len(replicas)} replicas ready; {base.get('detail', '')}".rstrip("; ")
    base["replicas"] = [
        {
            "replica": name,
            "status": report["health"].get("status"),
            "detail": report["health"].get("detail"),
            "report_age_s": round(float(report.get("age_s", 0.0)), 3),
            "gpus": report["health"].get("gpus", []),
        }
        for name, report in sorted(replicas.items())
    ]
    if "gpus" in base:  # every replica's GPUs: one entry per replica and GPU (sum them by uuid for a GPU's total)
        base["gpus"] = [gpu for entry in base["replicas"] for gpu in entry["gpus"]]
    return base, 200 if ready else 503


def fleet_metrics(replicas: Mapping[str, Mapping[str, Any]], gateways: Mapping[str, Mapping[str, Any]]) -> dict:
    """The fleet's /metrics: the single server's keys over every replica, ``replicas`` (each one's own body and the
    age of its report) and ``gateway`` (requests the gateways forwarded, retried and failed, summed)."""
    bodies = [r["metrics"] for _, r in sorted(replicas.items()) if isinstance(r.get("metrics"), Mapping)]
    merged = _sum(bodies) if bodies else {}
    if bodies:
        merged["uptime_s"] = max(b.get("uptime_s") or 0.0 for b in bodies)
        batches = sum(b.get("batches_total") or 0 for b in bodies)
        weighted = sum((b.get("mean_batch_size") or 0.0) * (b.get("batches_total") or 0) for b in bodies)
        merged["mean_batch_size"] = weighted / batches if batches else None
        merged["latency_ms"] = _slowest_latency([b.get("latency_ms") or {} for b in bodies])
        if isinstance(merged.get("web"), dict):
            merged["web"] = _web_totals(merged["web"], [b["web"] for b in bodies if isinstance(b.get("web"), Mapping)])
    merged["replicas"] = [
        {"replica": name, "report_age_s": round(float(r.get("age_s", 0.0)), 3), **r["metrics"]}
        for name, r in sorted(replicas.items())
        if isinstance(r.get("metrics"), Mapping)
    ]
    merged["gateway"] = _sum([g["counters"] for g in gateways.values() if isinstance(g.get("counters"), Mapping)])
    return merged


#: the web backend's figures read from the cache file the replicas share: the fleet's is the largest (freshest) one
_WEB_SHARED = ("cached_answers", "cached_pages", "run_live_calls", "run_spend_usd")


def _web_totals(summed: dict, webs: list[Mapping[str, Any]]) -> dict:
    """The web block of the fleet: counters summed, the hit rate of the sums, the shared file's figures not summed."""
    for key in _WEB_SHARED:
        values = [v for w in webs if isinstance(v := w.get(key), int | float)]
        summed[key] = max(values) if values else None
    lookups = summed.get("lookups_total") or 0
    summed["cache_hit_rate"] = (summed.get("cache_hits_total") or 0) / lookups if lookups else None
    return summed


def _slowest_latency(latencies: list[Mapping[str, Any]]) -> dict:
    out: dict[str, Any] = {"window": sum(int(x.get("window") or 0) for x in latencies)}
    for key in sorted({k for x in latencies for k in x} - {"window"}):
        values = [v for x in latencies if isinstance(v := x.get(key), int | float)]
        out[key] = max(values) if values else None
    return out


def _sum(bodies: list[Mapping[str, Any]]) -> dict:
    """Numbers summed key by key, nested dicts merged the same way; ``None`` and other values: the first one given."""
    out: dict[str, Any] = {}
    for body in bodies:
        for key, value in body.items():
            have = out.get(key)
            if isinstance(value, Mapping):
                out[key] = _sum([have, value]) if isinstance(have, Mapping) else _sum([value])
            elif isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = have + value if isinstance(have, int | float) and not isinstance(have, bool) else value
            elif key not in out or have is None:
                out[key] = value
    return out


class FleetViewApp:
    """ASGI: GET /health and GET /metrics answered for the fleet, every other request passed to ``app``.

    ``read_board`` returns FleetBoard.read()'s reports; ``live`` this process's own report, fresher than the board's
    copy (``{"retriever": {name: report}}`` or ``{"gateway": {name: report}}``).
    """

    def __init__(self, app, read_board: Callable[[], Awaitable[dict]], live: Callable[[], dict]) -> None:
        self.app, self.read_board, self.live = app, read_board, live

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in ("/health", "/metrics"):
            await self.app(scope, receive, send)
            return
        try:
            reports = await self.read_board()
        except Exception as e:  # noqa: BLE001 - the board's replica is being replaced: say so, as JSON
            logger.warning("fleet view: the fleet board did not answer (%s)", type(e).__name__)
            detail = "the fleet's board (replica reports) is not answering; retry shortly"
            await error_response(503, "unavailable", detail)(scope, receive, send)
            return
        for kind, own in self.live().items():
            reports.setdefault(kind, {}).update({name: {**r, "age_s": 0.0} for name, r in own.items()})
        if scope["path"] == "/health":
            body, status = fleet_health(reports.get("retriever", {}))
        else:
            body, status = fleet_metrics(reports.get("retriever", {}), reports.get("gateway", {})), 200
        await JSONResponse(body, status_code=status)(scope, receive, send)
