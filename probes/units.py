# SPDX-License-Identifier: Apache-2.0
"""How a value reads as text in ``top`` (the units a :class:`probes.plugin.TopColumn` names, and a
plugin's footer line). Plain strings: rendering them is noisyneighbor/views.py's job."""

from __future__ import annotations


def fmt_us(us: float | None, exact: bool = True) -> str:
    """A latency in µs as `523µs` / `4.1ms` / `2.35s`; `≤` when only the histogram slot's bound is known."""
    if us is None:
        return "-"
    if us >= 1e6:
        text = f"{us / 1e6:.2f}s"
    elif us >= 1000:
        text = f"{us / 1000:.1f}ms"
    else:
        text = f"{us:.0f}µs"
    return text if exact else f"≤{text}"


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f}ms"


def fmt_rate(value: float | None) -> str:
    """Counts per second: one decimal below 10, none above."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def fmt_num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_bytes(value: float | None) -> str:
    """Bytes in binary units: `512.0MiB`, `3.50GiB`."""
    if value is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.2f}{unit}" if unit == "GiB" else f"{value / size:.1f}{unit}"
    return f"{value:.0f}B"
