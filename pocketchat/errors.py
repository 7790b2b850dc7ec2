"""Every error a client is told about: one class per `error.code` of docs/protocol.md, raised where it
happens and turned into an `error` frame (or an HTTP status) in one place, the socket or the route."""

import math


class ProtocolError(Exception):
    """An error the client is told about in an `error` frame; the socket stays open."""

    code = "internal"

    def __init__(self, message: str, turn_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.turn_id = turn_id


class BadFrame(ProtocolError):
    code = "bad_frame"


class TooLarge(ProtocolError):
    code = "too_large"


class TurnInProgress(ProtocolError):
    code = "turn_in_progress"

    def __init__(self, message: str = "A reply is still being written; stop it or wait for it to finish.") -> None:
        super().__init__(message)


class UnknownConversation(ProtocolError):
    code = "unknown_conversation"


class ImportUnderWay(ProtocolError):
    """A change to a conversation an import is still writing: should the import fail, the conversation goes
    with the rest of it, and so would the change. Nothing was changed."""

    code = "importing"

    def __init__(self) -> None:
        super().__init__("This conversation is still being imported: it can be changed once the import has ended.")


class NothingToRegenerate(ProtocolError):
    code = "nothing_to_regenerate"


class ImagesNotSupported(ProtocolError):
    """A message (or a regenerate or edit of one) with images, for a model that cannot see them: nothing
    was sent, and no turn started."""

    code = "images_not_supported"


class OverQuota(ProtocolError):
    """What a frame asks would take the user's stored images over their limit: nothing was sent."""

    code = "over_quota"


class RateLimited(ProtocolError):
    """The user went over one of their limits; nothing already running is touched."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))  # whole seconds, as HTTP's Retry-After


class Unavailable(ProtocolError):
    """A service PocketChat needs (Redis, with replicas) cannot be reached; trying again later may work."""

    code = "unavailable"


class StorageError(ProtocolError):
    """The database failed to write; what it could not write is kept in memory and written again."""

    code = "storage_error"


class ProviderError(ProtocolError):
    """The model provider failed; `retryable` says whether trying again may help."""

    code = "provider_error"

    def __init__(self, message: str, status: int | None = None, retryable: bool = False, kind: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        # For /metrics: http_<status>, timeout, connection, stream_cut, unreadable, or what raised it.
        self.kind = kind or (f"http_{status}" if status else "other")


ERROR_CODES = [cls.code for cls in ProtocolError.__subclasses__()]
