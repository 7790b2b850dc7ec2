"""The one reader of a replica: a single blocking `XREAD` over the events stream and the stream of
every turn followed here, handing what it reads to the coordinator (events) and to the mirrors. It
also tells whether Redis can be reached (`failure`)."""

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from pocketchat.cluster.mirrors import Mirrors
from pocketchat.cluster.redis_link import REDIS_FAILURES, RedisLink
from pocketchat.cluster.watchdog import Sight

logger = logging.getLogger("pocketchat")

READ_BLOCK_MS = 100  # a newly mirrored stream joins the next read within this
READ_GATHER_SECONDS = 0.005  # a follower is this much later, and reads many entries per call


class Reader:
    def __init__(
        self, link: RedisLink, mirrors: Mirrors, on_event: Callable[[dict[str, Any]], None], sight: Sight
    ) -> None:
        self.link = link
        self.mirrors = mirrors
        self.on_event = on_event
        self.sight = sight  # shared with the watchdog: both say when Redis answered
        self.failure: str | None = None  # why Redis cannot be reached now
        self.on_lag: Callable[[float], None] | None = None  # told how far behind the producer a read was
        self._events_from = "0-0"

    async def from_now(self) -> None:
        """Read only the events published from now on (without this, every event still in the stream)."""
        self._events_from = await self.link.last_event_id()

    async def read(self) -> None:
        """A round of the one reader of this replica: events and every mirrored turn, in one blocking XREAD."""
        streams = {self.link.events: self._events_from}
        streams.update(self.mirrors.positions())
        asked = time.monotonic()
        try:
            found = await self.link.reader.xread(streams, count=1000, block=READ_BLOCK_MS)
        except REDIS_FAILURES as error:
            self.sight.lost()
            if self.failure is None:
                logger.warning("lost Redis: %s", error)
            self.failure = str(error) or type(error).__name__  # /healthz says so until a read succeeds
            await asyncio.sleep(1)
            return
        self.sight.answered(asked)
        self.failure = None
        if found:
            await asyncio.sleep(READ_GATHER_SECONDS)  # the next read then gets more per stream
        try:
            self._dispatch(found)
        except Exception:
            logger.exception("could not take what Redis sent")  # the reader must go on, whatever it was

    def _dispatch(self, found: list[Any]) -> None:
        """Hand what one XREAD returned to the events and the mirrors."""
        for key, entries in found:
            name = key.decode()
            decoded = [(entry_id.decode(), fields) for entry_id, fields in entries]
            if name == self.link.events:
                for entry_id, fields in decoded:
                    self._events_from = entry_id
                    self.on_event(json.loads(fields[b"e"]))
            elif (mirror := self.mirrors.get(name.rpartition(":")[2])) is not None:
                self.mirrors.take(mirror, [(entry_id, fields[b"f"].decode()) for entry_id, fields in decoded])
                if self.on_lag is not None and b"t" in decoded[-1][1]:
                    self.on_lag(time.time() - float(decoded[-1][1][b"t"]))
