"""Draw the dashboard's main panels from a Prometheus server's data to a PNG, for a person to look at without
a Grafana server:

    python dashboards/render.py out.png --prometheus http://127.0.0.1:9090 [--minutes 10] [--step 2]

Every panel of dashboards/kafka-consumer-gateway.json except rows and the multi-replica-only ones is drawn
as a time series of its targets over the last ``--minutes``; template variables match everything (``.*``)
and ``$__rate_interval`` is ``--rate-interval``. Needs httpx and matplotlib (the ``test`` extra). The PNG is
an output: do not commit it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent / "kafka-consumer-gateway.json"
#: titles of the panels that show data only when several replicas forward requests to each other
MULTI_REPLICA_MARK = "(multi-replica only)"
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True)
class Query:
    panel: str
    ref_id: str
    expr: str  # as in the dashboard, with template variables
    legend: str
    unit: str
    multi_replica: bool


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that is not a row, rows' nested (collapsed) panels included, in dashboard order."""
    out: list[dict[str, Any]] = []
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            out += [q for q in p.get("panels", []) if q.get("type") != "row"]
        else:
            out.append(p)
    return out


def queries(dashboard: dict[str, Any]) -> list[Query]:
    return [Query(p["title"], t["refId"], t["expr"], t.get("legendFormat", ""),
                  p.get("fieldConfig", {}).get("defaults", {}).get("unit", ""), MULTI_REPLICA_MARK in p["title"])
            for p in panels(dashboard) for t in p.get("targets", []) if t.get("expr")]


def substitute(expr: str, rate_interval: str = "15s") -> str:
    """The expression Grafana would send with every template variable at "All" (``.*``)."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("${__rate_interval}", rate_interval)
    return _VARIABLE.sub(".*", expr)


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or json.dumps(labels)


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    import httpx

    r = httpx.get(f"{prometheus}/api/v1/query_range",
                  params={"query": expr, "start": start, "end": end, "step": step}, timeout=30)
    r.raise_for_status()
    body = r.json()
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return list(body["data"]["result"])


def render(prometheus: str, out: Path, minutes: float = 10.0, step: float = 2.0, rate_interval: str = "15s",
           dashboard: dict[str, Any] | None = None, end: float | None = None) -> int:
    """Draw the panels to ``out``; the number of panels that had data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = dashboard or load()
    end = time.time() if end is None else end
    start = end - minutes * 60
    main = [p for p in panels(dashboard) if MULTI_REPLICA_MARK not in p["title"] and p.get("targets")]
    cols = 3
    rows = math.ceil(len(main) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    with_data = 0
    for ax, p in zip(axes.flat, main, strict=False):
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        drawn = 0
        for t in p["targets"]:
            for series in query_range(prometheus, substitute(t["expr"], rate_interval), start, end, step):
                xs = [float(ts) - end for ts, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, linewidth=1, label=legend(t.get("legendFormat", ""), series["metric"])[:40])
                drawn += 1
        with_data += drawn > 0
        ax.set_title(p["title"], fontsize=10)
        ax.set_xlim(-minutes * 60, 0)
        ax.set_xlabel("seconds before now", fontsize=7)
        ax.set_ylabel(unit, fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in list(axes.flat)[len(main):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard.get('title', '')} — {prometheus}, last {minutes:g} min", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return with_data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("out", type=Path, help="PNG file to write")
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    ap.add_argument("--minutes", type=float, default=10.0, help="time range (minutes before now)")
    ap.add_argument("--step", type=float, default=2.0, help="query resolution (seconds)")
    ap.add_argument("--rate-interval", default="15s", help="value of $__rate_interval")
    ap.add_argument("--dashboard", type=Path, default=DASHBOARD, help="dashboard JSON")
    args = ap.parse_args(argv)
    n = render(args.prometheus.rstrip("/"), args.out, args.minutes, args.step, args.rate_interval,
               load(args.dashboard))
    print(f"{args.out}: {n} panels with data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
