"""The dashboard drawn from a live Prometheus, as one SVG: every panel of
roles/monitoring/files/grafana/sparkfleet-dashboard.json, its series over a time range (query_range),
one line chart per panel. No Grafana needed: the README's picture is drawn by the lab's real tier
(tests/real/test_real_monitoring.py) from the lab's Prometheus.

`query_range(expr, start, end, step) -> [{"metric": {...}, "values": [[t, "v"], ...]}]` is handed in
(the tests ask the monitoring node over SSH); drawing is pure.
"""
import json
import math
from html import escape
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[1] / "roles/monitoring/files/grafana/sparkfleet-dashboard.json"
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
W, H, PAD = 560, 230, 44


def legend(fmt: str, metric: dict) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label."""
    out = fmt
    for key, value in metric.items():
        out = out.replace("{{" + key + "}}", str(value))
    return out


def fetch(query_range, variables: dict[str, str], start: float, end: float, step: float,
          dashboard: dict | None = None) -> list[dict]:
    """[{"title", "unit", "series": [(name, [(t, v), ...])]}] for every panel, its variables replaced."""
    dashboard = dashboard or json.loads(DASHBOARD.read_text())
    panels = []
    for panel in dashboard["panels"]:
        series = []
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(name, value)
            for result in query_range(expr, start, end, step):
                points = [(float(t), float(v)) for t, v in result["values"] if math.isfinite(float(v))]
                if points:
                    series.append((legend(target.get("legendFormat", ""), result["metric"]), points))
        panels.append({"title": panel["title"], "unit": panel["fieldConfig"]["defaults"].get("unit", ""),
                       "series": series})
    return panels


def _number(v: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{v:.0%}"
    if unit in ("bytes", "bps"):
        for size, suffix in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
            if abs(v) >= size:
                return f"{v / size:.1f}{suffix}{'B' if unit == 'bytes' else 'b/s'}"
        return f"{v:.0f}{'B' if unit == 'bytes' else 'b/s'}"
    if unit == "s":
        return f"{v:.3g}s"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _panel(p: dict, x0: float, y0: float) -> list[str]:
    out = [f'<rect x="{x0}" y="{y0}" width="{W}" height="{H}" fill="#ffffff" stroke="#d0d0d0"/>',
           f'<text x="{x0 + 10}" y="{y0 + 18}" font-size="13" font-weight="bold">{escape(p["title"])}</text>']
    points = [pt for _, pts in p["series"] for pt in pts]
    if not points:
        return out + [f'<text x="{x0 + W / 2}" y="{y0 + H / 2}" font-size="12" text-anchor="middle" fill="#888">'
                      'no data</text>']
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    lo, hi = min(0.0, min(v for _, v in points)), max(v for _, v in points)
    hi = hi if hi > lo else lo + 1
    left, top, right, bottom = x0 + PAD + 14, y0 + 28, x0 + W - 10, y0 + H - 46

    def xy(t, v):
        x = left + (right - left) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)
        return x, bottom - (bottom - top) * (v - lo) / (hi - lo)

    for frac in (0, 0.5, 1):
        v = lo + (hi - lo) * frac
        _, y = xy(t0, v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#eeeeee"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_number(v, p["unit"])}</text>')
    minutes = (t1 - t0) / 60
    out.append(f'<text x="{right}" y="{bottom + 14}" font-size="10" text-anchor="end">last {minutes:.0f} min</text>')
    for i, (name, pts) in enumerate(p["series"][:len(COLOURS)]):
        colour = COLOURS[i]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(t, v) for t, v in pts))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{path}"/>')
        lx, ly = x0 + 10 + (i % 3) * 180, y0 + H - 26 + (i // 3) * 12
        out.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{colour}"/>'
                   f'<text x="{lx + 14}" y="{ly - 4}" font-size="10">{escape(name[:28])}</text>')
    return out


def svg(panels: list[dict], title: str) -> str:
    """Every panel, two to a row, under a title."""
    rows = math.ceil(len(panels) / 2)
    width, height = 2 * W + 30, 40 + rows * (H + 10)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="#f7f7f7"/>',
           f'<text x="10" y="26" font-size="16" font-weight="bold">{escape(title)}</text>']
    for i, p in enumerate(panels):
        out += _panel(p, 10 + (i % 2) * (W + 10), 40 + (i // 2) * (H + 10))
    return "\n".join(out + ["</svg>"]) + "\n"
