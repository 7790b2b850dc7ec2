"""The PostgreSQL database's schema: one step per version, `schema_version` holding a row per step
applied, and `migrate` bringing it up to date at start under an advisory lock, so that replicas
starting together migrate it once."""

import logging
import time

import asyncpg

logger = logging.getLogger(__name__)
START_TIMEOUT = 300.0  # seconds for start-up statements: waiting for another replica's migration, the sweep

# The key of the advisory lock that serialises migrations (any constant, the same in every replica).
SCHEMA_LOCK = 0x706F636B6574  # "pocket"

# The schema, one step per version; `schema_version` holds a row per step applied. PostgreSQL applies
# DDL in transactions, so a step and its row land together or not at all.
SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)
"""
MIGRATIONS = [
    # The tables and columns of SQLite's schema (its steps 1 and 2). Timestamps are float seconds, as
    # in SQLite, so that records round-trip exactly; meta is the JSON text SQLite keeps (JSONB would
    # reorder its keys). "user" is quoted: unquoted it is PostgreSQL's CURRENT_USER.
    """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    title TEXT,
    model TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    owner TEXT NOT NULL DEFAULT 'local'
);
CREATE INDEX conversations_by_owner ON conversations (owner, updated_at);
CREATE TABLE messages (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    turn_id TEXT,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    error TEXT,
    meta TEXT NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, seq);
CREATE TABLE sessions (
    id_hash TEXT PRIMARY KEY,
    "user" TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);
CREATE TABLE secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
""",
    # The generated access token is kept as its hash (hex SHA-256, as `token_hash` makes it): a copy of
    # the database signs nobody in.
    """
INSERT INTO secrets (name, value)
    SELECT 'access_token_hash', encode(sha256(convert_to(value, 'UTF8')), 'hex') FROM secrets
    WHERE name = 'access_token'
    ON CONFLICT (name) DO UPDATE SET value = excluded.value;
DELETE FROM secrets WHERE name = 'access_token';
""",
    # Deleted conversations, for a day: a replica whose first turn of a conversation started as another
    # deleted it must not store it again (SQLite's step 4).
    """
CREATE TABLE deleted_conversations (id TEXT PRIMARY KEY, deleted_at DOUBLE PRECISION NOT NULL);
""",
    # Documents (SQLite's step 5): files attached to a conversation (deleted with it), their passages
    # with a vector each (float32 bytes), and a full-text index of the passages (a tsvector column the
    # server keeps, with a GIN index).
    """
CREATE TABLE documents (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    size BIGINT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    progress DOUBLE PRECISION NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0,
    embedder TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX documents_by_conversation ON documents (conversation_id, created_at);
CREATE INDEX documents_by_owner ON documents (owner);
CREATE TABLE chunks (
    id BIGSERIAL PRIMARY KEY,
    document_id TEXT NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    page INTEGER,
    text TEXT NOT NULL,
    vector BYTEA NOT NULL,
    words TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE INDEX chunks_by_document ON chunks (document_id, seq);
CREATE INDEX chunks_words ON chunks USING GIN (words);
""",
    # Images attached to user messages (SQLite's step 6): deleted with their conversation, bytes and all;
    # `message_id` NULL while one waits to go with the next message (no foreign key, as in SQLite).
    """
CREATE TABLE images (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    message_id TEXT,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    size BIGINT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    data BYTEA NOT NULL
);
CREATE INDEX images_by_conversation ON images (conversation_id, created_at);
CREATE INDEX images_by_owner ON images (owner);
""",
    # Tools (SQLite's step 7): the tool sources a conversation turned off, as JSON text (a list of names).
    """
ALTER TABLE conversations ADD COLUMN tools_off TEXT NOT NULL DEFAULT '[]';
""",
    # Versions (SQLite's step 8): each message names the one before it on its path (NULL for a
    # conversation's first), a conversation the last message of the path it shows (NULL: the latest).
    # A history from before is one path: each message's parent is the one before it.
    """
ALTER TABLE messages ADD COLUMN parent_id TEXT;
ALTER TABLE conversations ADD COLUMN leaf_id TEXT;
UPDATE messages SET parent_id = ordered.before
    FROM (SELECT seq, lag(id) OVER (PARTITION BY conversation_id ORDER BY seq) AS before FROM messages) AS ordered
    WHERE messages.seq = ordered.seq AND ordered.before IS NOT NULL;
""",
    # Search (SQLite's step 9, pocketchat/search.py): a tsvector of each final message (NULL while a reply
    # streams: it is rewritten every few seconds), with its owner as one more lexeme ('~' and the hex
    # SHA-256 of the name, which no query word can be) so that one user's search never ranks another's
    # messages, and a tsvector of each title; both with GIN indexes, written by the statement that writes
    # the row, so they never drift. The UPDATE fills the vectors of the messages stored before. Text is
    # read with '<' as a space: PostgreSQL's parser skips what looks like an HTML tag, and a chat's code
    # and pasted markup must be found by its words.
    """
CREATE FUNCTION messages_words() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner_lexeme TEXT;
BEGIN
    IF NEW.status = 'streaming' THEN
        NEW.words := NULL;
    ELSE
        SELECT '~' || encode(sha256(convert_to(owner, 'UTF8')), 'hex') INTO owner_lexeme
            FROM conversations WHERE id = NEW.conversation_id;
        NEW.words := to_tsvector('english', translate(NEW.content, '<', ' '))
            || array_to_tsvector(ARRAY[coalesce(owner_lexeme, '~')]);
    END IF;
    RETURN NEW;
END
$$;
ALTER TABLE messages ADD COLUMN words TSVECTOR;
CREATE TRIGGER messages_words BEFORE INSERT OR UPDATE OF content, status ON messages
    FOR EACH ROW EXECUTE FUNCTION messages_words();
UPDATE messages SET status = status WHERE status != 'streaming';
CREATE INDEX messages_words ON messages USING GIN (words);
ALTER TABLE conversations
    ADD COLUMN title_words TSVECTOR
    GENERATED ALWAYS AS (to_tsvector('english', translate(coalesce(title, ''), '<', ' '))) STORED;
CREATE INDEX conversations_title_words ON conversations USING GIN (title_words);
""",
    # Per-conversation sampling (SQLite's step 10): its temperature, top_p and max_tokens, as JSON text.
    """
ALTER TABLE conversations ADD COLUMN sampling TEXT NOT NULL DEFAULT '{}';
""",
    # Share links (SQLite's step 11): a conversation's snapshot under the hash of its link's token.
    """
CREATE TABLE shares (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    snapshot TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX shares_by_conversation ON shares (conversation_id, created_at);
""",
    # Imports under way (SQLite's step 13): each conversation an import wrote, until the import ends.
    """
CREATE TABLE running_imports (id TEXT PRIMARY KEY, replica TEXT NOT NULL, told_at DOUBLE PRECISION NOT NULL);
CREATE TABLE unfinished_imports (
    conversation_id TEXT PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
    import_id TEXT NOT NULL,
    partial BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX unfinished_imports_by_import ON unfinished_imports (import_id);
""",
    # A message's words computed once (bench/search.py): an upsert fires the BEFORE INSERT trigger for the
    # row it proposes even when that row is already there (a reply's checkpoint, its end), and then the
    # BEFORE UPDATE trigger for the row it updates; the first no longer computes what the second will.
    """
CREATE OR REPLACE FUNCTION messages_words() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner_lexeme TEXT;
BEGIN
    IF NEW.status = 'streaming' THEN
        NEW.words := NULL;
    ELSIF TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM messages WHERE id = NEW.id) THEN
        RETURN NEW;  -- it conflicts: the update's trigger writes the words, if the row is updated
    ELSE
        SELECT '~' || encode(sha256(convert_to(owner, 'UTF8')), 'hex') INTO owner_lexeme
            FROM conversations WHERE id = NEW.conversation_id;
        NEW.words := to_tsvector('english', translate(NEW.content, '<', ' '))
            || array_to_tsvector(ARRAY[coalesce(owner_lexeme, '~')]);
    END IF;
    RETURN NEW;
END
$$;
""",
    # A message is indexed by its first 65,536 characters (pocketchat/search.py's SEARCHABLE_CHARACTERS):
    # a tsvector holds at most 1 MB (1,048,575 bytes) of lexemes and positions, and to_tsvector raises
    # past it ("string is too long for tsvector"), which failed the statement writing the message: a long
    # reply ended `internal`, an import failed for good. Within 65,536 characters it cannot: each
    # character is in at most two of the parser's tokens (a hyphenated word and its part; a URL and its
    # host or path), each token makes at most one lexeme (the english configuration's dictionaries), of
    # at most 4 bytes a character, and costs at most 5 bytes more (alignment, a position count, one
    # position; more positions come from more tokens); tokens (at least a character and a separator
    # each, a compound three) are at most 0.75 a character: 8 + 5 x 0.75 = 11.75 bytes a character at
    # most, 770,048 bytes. The worst text measured takes 7.5 (distinct four-byte letters in pairs, "X-Y").
    # Titles (at most 1,000 characters) and document passages (about 700) stay far below. The UPDATE
    # indexes the long messages stored before again (octet_length: the stored size, nothing read).
    """
CREATE OR REPLACE FUNCTION messages_words() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner_lexeme TEXT;
BEGIN
    IF NEW.status = 'streaming' THEN
        NEW.words := NULL;
    ELSIF TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM messages WHERE id = NEW.id) THEN
        RETURN NEW;  -- it conflicts: the update's trigger writes the words, if the row is updated
    ELSE
        SELECT '~' || encode(sha256(convert_to(owner, 'UTF8')), 'hex') INTO owner_lexeme
            FROM conversations WHERE id = NEW.conversation_id;
        NEW.words := to_tsvector('english', translate(left(NEW.content, 65536), '<', ' '))
            || array_to_tsvector(ARRAY[coalesce(owner_lexeme, '~')]);
    END IF;
    RETURN NEW;
END
$$;
UPDATE messages SET status = status WHERE status != 'streaming' AND octet_length(content) > 65536;
""",
    # The path a conversation shows has a version (SQLite's step 16): each write of `leaf_id` (a switch, a
    # turn's opening write) says which version it replaces, `WHERE path_version = $expected`, and writes
    # the next. Replicas write it, and a write can land late (a stalled database, a replica that had not
    # read another's turn yet): then it is refused, not applied over what came after it.
    """
ALTER TABLE conversations ADD COLUMN path_version BIGINT NOT NULL DEFAULT 0;
""",
    # Imports as the database knows them (SQLite's step 17), which every replica asks, whatever Redis
    # lost: a running import names its owner, one at a time (the unique index: a claim is an insert that
    # may conflict; NULL for one from before), and how far it got; an ended one is kept in `ended_imports`
    # for an hour, with how it ended, so that any replica answers for it.
    """
ALTER TABLE running_imports ADD COLUMN owner TEXT;
ALTER TABLE running_imports ADD COLUMN total BIGINT NOT NULL DEFAULT 0;
ALTER TABLE running_imports ADD COLUMN imported BIGINT NOT NULL DEFAULT 0;
ALTER TABLE running_imports ADD COLUMN dropped TEXT NOT NULL DEFAULT '{}';
CREATE UNIQUE INDEX running_imports_by_owner ON running_imports (owner);
CREATE TABLE ended_imports (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    total BIGINT NOT NULL,
    imported BIGINT NOT NULL,
    dropped TEXT NOT NULL,
    error TEXT,
    ended_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX ended_imports_by_time ON ended_imports (ended_at);
""",  # The flow a conversation's turns run, by its name in flow.py's FLOWS ('': the deployment's --flow).
    """
ALTER TABLE conversations ADD COLUMN flow TEXT NOT NULL DEFAULT '';
""",  # The memory flow's facts about each user, with their vectors, and who turned memory off (store/memory.py).
    """
CREATE TABLE facts (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, text TEXT NOT NULL, vector BYTEA NOT NULL, embedder TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX facts_by_owner ON facts (owner, created_at);
CREATE TABLE memory_off (owner TEXT PRIMARY KEY, since DOUBLE PRECISION NOT NULL);
""",
]


async def migrate(db: asyncpg.Connection) -> None:
    """Bring the database's schema up to date. Replicas that start together queue on the advisory lock;
    each one after the first finds the steps applied and applies nothing."""
    async with db.transaction():
        # Waiting for another replica's migration, and migrating, may take longer than any write.
        await db.execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")
        # The transaction-scoped lock is released by the commit (or by the server if this process dies).
        await db.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK, timeout=START_TIMEOUT)
        await db.execute(SCHEMA_VERSION_TABLE)
        version = await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
        if version > len(MIGRATIONS):
            logger.warning("database schema version %d is newer than this release's %d", version, len(MIGRATIONS))
        for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
            await db.execute(step, timeout=START_TIMEOUT)
            await db.execute("INSERT INTO schema_version VALUES ($1, $2)", number, time.time())
            logger.info("database schema upgraded to version %d", number)
