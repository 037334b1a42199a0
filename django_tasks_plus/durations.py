"""Durations as people read them, for the worker's log, the admin and the commands (pure)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """A short duration: ``850 ms``, ``4.2 s``, ``40 s``, ``3 min 5 s``, ``2 h 4 min``,
    ``3 d 1 h``. The sign is dropped: callers say "ago" or "in"."""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)  # rounded first, so 59.6 s reads "1 min", not "60 s"
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
