"""The current date and time, for the model's clock tool (a model knows only its training's past)."""

import datetime
import functools
import zoneinfo


class UnknownTimeZone(ValueError):
    """Not a time zone of the IANA database (Europe/Paris, America/New_York, UTC...)."""


@functools.cache
def _zone_names() -> frozenset[str]:
    # The names of the IANA database, as this host holds it (read once: a walk of its files). Not any
    # name ZoneInfo opens: "localtime" (and "posixrules", "posix/...", which the list leaves out) are
    # the host's own files, and "localtime" would tell the host's time zone to whoever asks.
    return frozenset(zoneinfo.available_timezones() - {"localtime"})


def current_time(timezone: str | None = None, now: datetime.datetime | None = None) -> str:
    """The date, time and weekday now, in `timezone` (an IANA name; default UTC), as one line:
    `2025-06-01T14:03:07+02:00 (Sunday, Europe/Paris)`. `now` is for tests."""
    name = timezone or "UTC"
    if name not in _zone_names():
        raise UnknownTimeZone(f"Unknown time zone {timezone!r:.60}; use an IANA name such as Europe/Paris.")
    zone = zoneinfo.ZoneInfo(name)
    moment = (now or datetime.datetime.now(datetime.UTC)).astimezone(zone).replace(microsecond=0)
    return f"{moment.isoformat()} ({moment.strftime('%A')}, {zone.key})"
