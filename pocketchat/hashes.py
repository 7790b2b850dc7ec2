"""What the database keeps of a secret: its hash (a copy of the database signs nobody in, opens no link)."""

import hashlib


def session_hash(session_id: str) -> str:
    """What the database keeps of a session id: its hash, so that a copy of the database signs nobody in."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def token_hash(token: str) -> str:
    """What the database keeps of a generated access token. A fast hash is enough: the token is 192
    random bits, which no one guesses from its hash."""
    return hashlib.sha256(token.encode()).hexdigest()
