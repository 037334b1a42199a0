"""Bar charts as inline SVG markup, built from plain numbers on the server.

Admin networks often have no internet and the app ships no JavaScript build, so the
overview's charts are drawn here: a pure function from numbers and labels to an SVG
string, with axes, tick labels and a unit. Colours are CSS classes (``dtp-chart-*``,
styled in ``static/django_tasks_plus/admin.css`` with the admin's variables), so the
light and dark themes both apply. Every text is escaped; the caller marks the result
safe. No Django and no I/O here, so every rule is unit-tested on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 720
HEIGHT = 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 28, 34  # room for tick labels, legend and x labels
CHAR_WIDTH = 6.5  # px of an 11 px label character, for spacing the x labels
STRIDES = (1, 2, 3, 5, 6, 10, 12, 15, 20, 30, 60, 120, 240, 360, 720, 1440)


@dataclass(frozen=True, slots=True)
class Series:
    """One stacked layer: a name for the legend, a value per x position, and the CSS
    class suffix of its colour (``dtp-chart-<kind>``)."""

    name: str
    values: Sequence[float]
    kind: str = "primary"


def nice_step(span: float, target: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``target`` ticks
    over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, target)
    magnitude = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 5, 10):
        if multiple * magnitude >= raw * (1 - 1e-9):
            return multiple * magnitude
    return 10 * magnitude  # pragma: no cover - the loop always returns


def ticks(maximum: float, *, target: int = 5, integer: bool = False) -> list[float]:
    """Tick values from 0 up to the first tick at or above ``maximum``. Counts
    (``integer``) never get fractional ticks; no data gives ``[0, 1]``."""
    if not math.isfinite(maximum) or maximum <= 0:
        return [0.0, 1.0]
    step = nice_step(maximum, target)
    if integer:
        step = max(1.0, round(step))
    count = math.ceil(maximum / step - 1e-9)
    return [i * step for i in range(count + 1)]


def compact(value: float) -> str:
    """A short tick label: ``0``, ``0.5``, ``12``, ``1.5k``, ``20M``, ``3G``."""
    if value == 0:
        return "0"
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return _trim(value / size) + suffix
    return _trim(value)


def _trim(value: float) -> str:
    text = (
        f"{value:.2f}"
        if abs(value) < 10
        else f"{value:.1f}"
        if abs(value) < 100
        else f"{value:.0f}"
    )
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration_label(seconds: float) -> str:
    """A histogram bucket's upper bound, short: ``1ms``, ``2.5ms``, ``1s``, ``5min``,
    ``1h``, ``+Inf``."""
    if not math.isfinite(seconds):
        return "+Inf"
    for size, suffix in ((3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size:
            return _trim(seconds / size) + suffix
    return _trim(seconds * 1000) + "ms"


def label_stride(labels: Sequence[str], plot_width: float) -> int:
    """Show every n-th x label so that the shown ones do not overlap."""
    if not labels:
        return 1
    widest = max(len(label) for label in labels) * CHAR_WIDTH + 8
    slot = plot_width / len(labels)
    needed = max(1, math.ceil(widest / slot))
    # A round stride, so minute labels fall on :00, :05, :10 ...
    return next((n for n in STRIDES if n >= needed), needed)


def bar_chart(
    *,
    chart_id: str,
    title: str,
    description: str,
    labels: Sequence[str],
    series: Sequence[Series],
    unit: str,
    integer: bool = True,
    empty_text: str = "No data in this window",
) -> str:
    """Stacked bars, one per label, with a y axis in ``unit``, gridlines, x labels (as
    many as fit), a legend, and a ``<title>`` per bar (its values, shown on hover).

    ``chart_id`` makes the ids of ``<title>``/``<desc>`` unique on the page, which
    ``aria-labelledby`` points at. Negative and non-finite values count as 0."""
    for layer in series:
        if len(layer.values) != len(labels):
            raise ValueError(
                f"Series {layer.name!r} has {len(layer.values)} values for {len(labels)} labels."
            )
    cid = escape(chart_id, quote=True)
    clean = [[_value(v) for v in layer.values] for layer in series]
    stacks = [sum(column) for column in zip(*clean, strict=True)] if clean else []
    top = max(stacks, default=0.0)
    tick_values = ticks(top, integer=integer)
    y_max = tick_values[-1]
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    base = TOP + plot_h

    def y(value: float) -> float:
        return base - plot_h * value / y_max

    out = [
        f'<svg class="dtp-chart" id="{cid}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" role="img" aria-labelledby="{cid}-title {cid}-desc" '
        f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{cid}-title">{escape(title)}</title>',
        f'<desc id="{cid}-desc">{escape(description)}</desc>',
    ]
    # Gridlines and y tick labels; the unit above the axis.
    for value in tick_values:
        ty = _n(y(value))
        out.append(
            f'<line class="dtp-chart-grid" x1="{LEFT}" y1="{ty}" x2="{WIDTH - RIGHT}" y2="{ty}"/>'
        )
        out.append(
            f'<text class="dtp-chart-tick" x="{LEFT - 6}" y="{ty}" text-anchor="end" '
            f'dominant-baseline="middle">{escape(compact(value))}</text>'
        )
    out.append(f'<text class="dtp-chart-unit" x="4" y="{TOP - 14}">{escape(unit)}</text>')
    # Bars.
    if labels:
        slot = plot_w / len(labels)
        bar_w = max(1.0, min(slot * 0.8, 48.0))
        for i, label in enumerate(labels):
            x = LEFT + i * slot + (slot - bar_w) / 2
            parts = [f"{layer.name} {compact(clean[j][i])}" for j, layer in enumerate(series)]
            tip = escape(f"{label}: {', '.join(parts)} ({unit})")
            out.append(f'<g class="dtp-chart-bar"><title>{tip}</title>')
            below = 0.0
            for j, layer in enumerate(series):
                value = clean[j][i]
                if value > 0:
                    y0, y1 = y(below), y(below + value)
                    out.append(
                        f'<rect class="dtp-chart-{escape(layer.kind, quote=True)}" '
                        f'x="{_n(x)}" y="{_n(y1)}" width="{_n(bar_w)}" '
                        f'height="{_n(max(0.5, y0 - y1))}"/>'
                    )
                below += value
            # An invisible full-height target so the tooltip works on empty slots too.
            out.append(
                f'<rect class="dtp-chart-hit" x="{_n(LEFT + i * slot)}" y="{TOP}" '
                f'width="{_n(slot)}" height="{plot_h}"/></g>'
            )
        stride = label_stride(labels, plot_w)
        for i in range(0, len(labels), stride):
            cx = _n(LEFT + (i + 0.5) * slot)
            out.append(
                f'<text class="dtp-chart-tick" x="{cx}" y="{base + 16}" '
                f'text-anchor="middle">{escape(labels[i])}</text>'
            )
    # Axes.
    out.append(
        f'<line class="dtp-chart-axis" x1="{LEFT}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}"/>'
    )
    out.append(f'<line class="dtp-chart-axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}"/>')
    if top <= 0:
        out.append(
            f'<text class="dtp-chart-empty" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" '
            f'text-anchor="middle">{escape(empty_text)}</text>'
        )
    # Legend, top right, in the series' order.
    widths = [14 + len(layer.name) * CHAR_WIDTH for layer in series]
    lx = WIDTH - RIGHT - sum(widths) - 14 * max(0, len(series) - 1)
    for layer, width in zip(series, widths, strict=True):
        out.append(
            f'<rect class="dtp-chart-{escape(layer.kind, quote=True)} dtp-chart-swatch" '
            f'x="{_n(lx)}" y="{TOP - 23}" width="10" height="10"/>'
        )
        out.append(
            f'<text class="dtp-chart-legend" x="{_n(lx + 14)}" y="{TOP - 14}">'
            f"{escape(layer.name)}</text>"
        )
        lx += width + 14
    out.append("</svg>")
    return "".join(out)


def _value(value: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def _n(value: float) -> str:
    """A coordinate with at most one decimal: short markup, stable output."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


__all__ = ["Series", "bar_chart", "compact", "duration_label", "label_stride", "nice_step", "ticks"]
