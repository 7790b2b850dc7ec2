"""The current date and time, for the model's clock tool (a model knows only its training's past)."""

import datetime
import zoneinfo


class UnknownTimeZone(ValueError):
    """Not a time zone of the IANA database (Europe/Paris, America/New_York, UTC...)."""


def current_time(timezone: str | None = None, now: datetime.datetime | None = None) -> str:
    """The date, time and weekday now, in `timezone` (an IANA name; default UTC), as one line:
    `2025-06-01T14:03:07+02:00 (Sunday, Europe/Paris)`. `now` is for tests."""
    try:
        zone = zoneinfo.ZoneInfo(timezone or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise UnknownTimeZone(f"Unknown time zone {timezone!r:.60}; use an IANA name such as Europe/Paris.") from None
    moment = (now or datetime.datetime.now(datetime.UTC)).astimezone(zone).replace(microsecond=0)
    return f"{moment.isoformat()} ({moment.strftime('%A')}, {zone.key})"
