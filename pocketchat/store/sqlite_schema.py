"""The SQLite file's schema: one step per version; `PRAGMA user_version` says how many steps a file
has had, and `migrate` brings it up to date at start."""

import logging
import sqlite3

from pocketchat.hashes import token_hash

logger = logging.getLogger(__name__)

# The schema, one step per version; `PRAGMA user_version` says how many steps a file has had. The
# first step is the schema of the first release, so its files (version 0) take it as a no-op.
MIGRATIONS = [
    """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT,
    model TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    turn_id TEXT,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    error TEXT,
    meta TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, seq);
""",
    # Sign-in: every conversation has an owner (the one local user, for those made before), sessions
    # are recorded so that they can be revoked, and the secret that signs them lives here.
    """
ALTER TABLE conversations ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
CREATE INDEX conversations_by_owner ON conversations(owner, updated_at);
CREATE TABLE sessions (
    id_hash TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    revoked_at REAL
);
CREATE TABLE secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
""",
    # The generated access token is kept as its hash: a copy of the file signs nobody in. (`token_hash`
    # is registered on the connection that migrates; secure_delete zeroes the clear value's bytes.)
    """
PRAGMA secure_delete = ON;
INSERT OR REPLACE INTO secrets (name, value)
    SELECT 'access_token_hash', token_hash(value) FROM secrets WHERE name = 'access_token';
DELETE FROM secrets WHERE name = 'access_token';
""",
    # Deleted conversations, for a day: with replicas (PostgreSQL's step 3), one whose first turn of a
    # conversation started as another deleted it must not store it again. Here for the same schema.
    """
CREATE TABLE deleted_conversations (id TEXT PRIMARY KEY, deleted_at REAL NOT NULL);
""",
    # Documents: files attached to a conversation (deleted with it), their passages with a vector each
    # (float32 bytes) and a full-text index of the passages (FTS5, kept in step by triggers; a cascade
    # from a deleted conversation or document fires them too).
    """
CREATE TABLE documents (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    size INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    progress REAL NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0,
    embedder TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX documents_by_conversation ON documents(conversation_id, created_at);
CREATE INDEX documents_by_owner ON documents(owner);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    page INTEGER,
    text TEXT NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX chunks_by_document ON chunks(document_id, seq);
CREATE VIRTUAL TABLE chunks_text USING fts5(text, content='chunks', content_rowid='id', tokenize='porter unicode61');
CREATE TRIGGER chunks_text_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_text(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER chunks_text_delete AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_text(chunks_text, rowid, text) VALUES ('delete', old.id, old.text);
END;
""",
    # Images attached to user messages (deleted with their conversation), bytes and all. `message_id` is
    # NULL while one waits to go with the next message. It names the message without a foreign key (an
    # edit once wrote its message again under the same id; since versions, an edit is a new message
    # with copies of the images).
    """
CREATE TABLE images (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    message_id TEXT,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    size INTEGER NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    created_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX images_by_conversation ON images(conversation_id, created_at);
CREATE INDEX images_by_owner ON images(owner);
""",
    # Tools: the tool sources a conversation turned off (JSON: a list of names; none before).
    """
ALTER TABLE conversations ADD COLUMN tools_off TEXT NOT NULL DEFAULT '[]';
""",
    # Versions: messages form a tree, each naming the message before it on its path (NULL for a
    # conversation's first), and a conversation remembers the last message of the path it shows (NULL:
    # the latest message). A history from before is one path: each message's parent is the one before.
    """
ALTER TABLE messages ADD COLUMN parent_id TEXT;
ALTER TABLE conversations ADD COLUMN leaf_id TEXT;
UPDATE messages SET parent_id = (
    SELECT before.id FROM messages AS before
    WHERE before.conversation_id = messages.conversation_id AND before.seq < messages.seq
    ORDER BY before.seq DESC LIMIT 1
);
""",
    # Search (pocketchat/search.py): full-text indexes of message text and of titles (FTS5 over the tables
    # themselves, kept by triggers in the writing transaction, so they never drift). A message is indexed
    # once it is final (a reply streaming is rewritten every few seconds), with its owner as a word of a
    # column of its own (the name's hex, matched in that column only: a message's text may hold anything),
    # so that a search reads no other user's matches. The view is what
    # the index holds, for FTS5 to read back (snippets, a rebuild). A conversation's messages are
    # deleted before it (the cascade would come after it), while their owner can still be read to take
    # them out of the index. Titles are indexed by the conversation's rowid, which VACUUM keeps (it copies
    # the table whole).
    """
CREATE VIEW messages_indexed (seq, content, owner) AS
    SELECT m.seq, m.content, hex(c.owner) FROM messages m JOIN conversations c ON c.id = m.conversation_id
    WHERE m.status != 'streaming';
CREATE VIRTUAL TABLE messages_text USING fts5(
    content, owner, content='messages_indexed', content_rowid='seq', tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_text_insert AFTER INSERT ON messages WHEN new.status != 'streaming' BEGIN
    INSERT INTO messages_text(rowid, content, owner)
        SELECT new.seq, new.content, hex(owner) FROM conversations WHERE id = new.conversation_id;
END;
CREATE TRIGGER messages_text_delete AFTER DELETE ON messages WHEN old.status != 'streaming' BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, old.content, hex(owner) FROM conversations WHERE id = old.conversation_id;
END;
CREATE TRIGGER messages_text_update AFTER UPDATE OF content, status ON messages BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, old.content, hex(owner) FROM conversations
        WHERE id = old.conversation_id AND old.status != 'streaming';
    INSERT INTO messages_text(rowid, content, owner)
        SELECT new.seq, new.content, hex(owner) FROM conversations
        WHERE id = new.conversation_id AND new.status != 'streaming';
END;
CREATE TRIGGER conversations_delete_messages BEFORE DELETE ON conversations BEGIN
    DELETE FROM messages WHERE conversation_id = old.id;
END;
CREATE VIRTUAL TABLE conversations_text USING fts5(
    title, content='conversations', tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER conversations_text_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO conversations_text(rowid, title) VALUES (new.rowid, new.title);
END;
CREATE TRIGGER conversations_text_delete AFTER DELETE ON conversations BEGIN
    INSERT INTO conversations_text(conversations_text, rowid, title) VALUES ('delete', old.rowid, old.title);
END;
CREATE TRIGGER conversations_text_update AFTER UPDATE OF title ON conversations BEGIN
    INSERT INTO conversations_text(conversations_text, rowid, title) VALUES ('delete', old.rowid, old.title);
    INSERT INTO conversations_text(rowid, title) VALUES (new.rowid, new.title);
END;
INSERT INTO messages_text(messages_text) VALUES ('rebuild');
INSERT INTO conversations_text(conversations_text) VALUES ('rebuild');
""",
    # Per-conversation sampling: the temperature, top_p and max_tokens it set (JSON: an object; none before).
    """
ALTER TABLE conversations ADD COLUMN sampling TEXT NOT NULL DEFAULT '{}';
""",
    # Share links: a snapshot of a conversation (title and messages, JSON) under the hash of its link's
    # token (never the token); revoking a link deletes it, and so does deleting its conversation.
    """
CREATE TABLE shares (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    snapshot TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX shares_by_conversation ON shares(conversation_id, created_at);
""",
    # The message index made cheaper to write (bench/search.py). FTS5 writes a segment of its own at every
    # statement that indexes a message (the trigger's statement is a savepoint, and FTS5 flushes at each):
    # a fixed cost several times that of the row itself. So, as PostgreSQL's GIN index keeps a pending
    # list, a final message is first listed in `messages_unindexed`, by the trigger of the statement that
    # writes it (in its transaction: what a search sees never drifts), and the messages listed go into
    # the index together, in one segment, by the statement that lists the 64th; a search also reads the
    # searcher's listed messages (store/sqlite_search.py). The index keeps neither positions
    # (detail=column: no query here is a phrase, each word is matched alone; column filters still work)
    # nor each row's token counts (columnsize=0: messages are ranked from their text). 'rebuild' leaves
    # the index in a few large segments on a low level of FTS5's merge tree, which the merges of the next
    # writes would copy whole, again and again; 'optimize' makes them one segment, on the top level.
    """
DROP TABLE messages_text;
CREATE VIRTUAL TABLE messages_text USING fts5(
    content, owner, content='messages_indexed', content_rowid='seq', tokenize='porter unicode61 remove_diacritics 2',
    detail=column, columnsize=0
);
CREATE TABLE messages_unindexed (seq INTEGER PRIMARY KEY);
DROP TRIGGER messages_text_insert;
DROP TRIGGER messages_text_delete;
DROP TRIGGER messages_text_update;
CREATE TRIGGER messages_text_insert AFTER INSERT ON messages WHEN new.status != 'streaming' BEGIN
    INSERT INTO messages_unindexed(seq) VALUES (new.seq);
END;
CREATE TRIGGER messages_text_delete AFTER DELETE ON messages WHEN old.status != 'streaming' BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, old.content, hex(owner) FROM conversations
        WHERE id = old.conversation_id AND old.seq NOT IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed WHERE seq = old.seq;
END;
-- A reply's checkpoints (streaming to streaming) fire neither; its end fires the second alone.
CREATE TRIGGER messages_text_update AFTER UPDATE OF content, status ON messages WHEN old.status != 'streaming' BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, old.content, hex(owner) FROM conversations
        WHERE id = old.conversation_id AND old.seq NOT IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed WHERE seq = old.seq;
    INSERT INTO messages_unindexed(seq) SELECT new.seq WHERE new.status != 'streaming';
END;
CREATE TRIGGER messages_text_final AFTER UPDATE OF content, status ON messages
    WHEN old.status = 'streaming' AND new.status != 'streaming' BEGIN
    INSERT INTO messages_unindexed(seq) VALUES (new.seq);
END;
CREATE TRIGGER messages_unindexed_flush AFTER INSERT ON messages_unindexed
    WHEN (SELECT count(*) FROM messages_unindexed) >= 64 BEGIN
    INSERT INTO messages_text(rowid, content, owner)
        SELECT seq, content, owner FROM messages_indexed WHERE seq IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed;
END;
INSERT INTO messages_text(messages_text) VALUES ('rebuild');
INSERT INTO messages_text(messages_text) VALUES ('optimize');
""",
    # Imports under way (transfer/imports.py): each with the process (replica) writing it and when its
    # last batch landed, and each conversation it wrote, until it ends. Should that process die mid-import,
    # the app that finds it gone deletes what it wrote: an import is kept whole or not at all. A batch
    # lands only while its import is listed here, so one deleted as stopped writes nothing more. A long
    # conversation goes in parts: until its last is in, it is `partial`, and no one lists or opens it.
    """
CREATE TABLE running_imports (id TEXT PRIMARY KEY, replica TEXT NOT NULL, told_at REAL NOT NULL);
CREATE TABLE unfinished_imports (
    conversation_id TEXT PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    import_id TEXT NOT NULL,
    partial INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX unfinished_imports_by_import ON unfinished_imports(import_id);
""",
    # The message index cheaper still to write (bench/search.py): a message no longer lists itself. The
    # index holds every finished message up to a mark (`messages_index_mark`, a seq) but those listed in
    # `messages_unindexed`; the messages after the mark wait, and go in together (one FTS5 segment) with
    # those listed, by the statement that writes the 64th message after it, which moves the mark to
    # itself. (Counted, not told by the seq: every upsert that updates, a reply's checkpoint say, uses a
    # seq up.) So a turn's new messages cost their index a comparison; a message finished (a reply that
    # streamed) or changed at or before the mark is listed, as before, until the next of those statements
    # (a start-up that ends many replies lists them all); a search reads the messages after the mark, and
    # those listed (store/sqlite_search.py). Only a finished message at or before the mark, not listed, is
    # in the index, and taken out of it when it changes or goes.
    """
CREATE TABLE messages_index_mark (seq INTEGER NOT NULL);
INSERT INTO messages_index_mark (seq) SELECT coalesce(max(seq), 0) FROM messages;
DROP TRIGGER messages_text_insert;
DROP TRIGGER messages_text_delete;
DROP TRIGGER messages_text_update;
DROP TRIGGER messages_text_final;
DROP TRIGGER messages_unindexed_flush;
CREATE TRIGGER messages_text_flush AFTER INSERT ON messages
    WHEN new.seq >= (SELECT seq FROM messages_index_mark) + 64
    AND (SELECT count(*) FROM messages WHERE seq > (SELECT seq FROM messages_index_mark)) >= 64 BEGIN
    INSERT INTO messages_text(rowid, content, owner)
        SELECT seq, content, owner FROM messages_indexed WHERE seq > (SELECT seq FROM messages_index_mark)
        UNION ALL
        SELECT seq, content, owner FROM messages_indexed WHERE seq IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed;
    UPDATE messages_index_mark SET seq = new.seq;
END;
CREATE TRIGGER messages_text_delete AFTER DELETE ON messages
    WHEN old.status != 'streaming' AND old.seq <= (SELECT seq FROM messages_index_mark) BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, old.content, hex(owner) FROM conversations
        WHERE id = old.conversation_id AND old.seq NOT IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed WHERE seq = old.seq;
END;
-- A message at or before the mark changed: out of the index if it is there, and listed if it is finished
-- (a reply that streamed ends, say). One trigger, not two: each that fires costs a turn's write.
CREATE TRIGGER messages_text_update AFTER UPDATE OF content, status ON messages
    WHEN (old.status != 'streaming' OR new.status != 'streaming') AND old.seq <= (SELECT seq FROM messages_index_mark)
    BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, old.content, hex(owner) FROM conversations
        WHERE old.status != 'streaming' AND id = old.conversation_id
        AND old.seq NOT IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed WHERE seq = old.seq;
    INSERT INTO messages_unindexed(seq) SELECT new.seq WHERE new.status != 'streaming';
END;
""",
    # A message is indexed by its first 65,536 characters (pocketchat/search.py's SEARCHABLE_CHARACTERS,
    # as PostgreSQL's step 13): FTS5 accepts any length, but an imported 7 MB message cost each search
    # that met it seconds (tokenized again while it waited to go in the index), and its writes as much.
    # The view is what the index holds; every 'delete' must give FTS5 the text it was given, so the
    # triggers that take a message out use the same start of it. The long messages in the index go out
    # with their whole text (the view as it was), then back in by their start (the view as it is now).
    """
CREATE TEMP TABLE long_messages AS SELECT seq FROM messages
    WHERE length(content) > 65536 AND status != 'streaming' AND seq <= (SELECT seq FROM messages_index_mark)
    AND seq NOT IN (SELECT seq FROM messages_unindexed);
INSERT INTO messages_text(messages_text, rowid, content, owner)
    SELECT 'delete', seq, content, owner FROM messages_indexed WHERE seq IN (SELECT seq FROM long_messages);
DROP VIEW messages_indexed;
CREATE VIEW messages_indexed (seq, content, owner) AS
    SELECT m.seq, substr(m.content, 1, 65536), hex(c.owner) FROM messages m
    JOIN conversations c ON c.id = m.conversation_id WHERE m.status != 'streaming';
INSERT INTO messages_text(rowid, content, owner)
    SELECT seq, content, owner FROM messages_indexed WHERE seq IN (SELECT seq FROM long_messages);
DROP TABLE long_messages;
DROP TRIGGER messages_text_delete;
DROP TRIGGER messages_text_update;
CREATE TRIGGER messages_text_delete AFTER DELETE ON messages
    WHEN old.status != 'streaming' AND old.seq <= (SELECT seq FROM messages_index_mark) BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, substr(old.content, 1, 65536), hex(owner) FROM conversations
        WHERE id = old.conversation_id AND old.seq NOT IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed WHERE seq = old.seq;
END;
CREATE TRIGGER messages_text_update AFTER UPDATE OF content, status ON messages
    WHEN (old.status != 'streaming' OR new.status != 'streaming') AND old.seq <= (SELECT seq FROM messages_index_mark)
    BEGIN
    INSERT INTO messages_text(messages_text, rowid, content, owner)
        SELECT 'delete', old.seq, substr(old.content, 1, 65536), hex(owner) FROM conversations
        WHERE old.status != 'streaming' AND id = old.conversation_id
        AND old.seq NOT IN (SELECT seq FROM messages_unindexed);
    DELETE FROM messages_unindexed WHERE seq = old.seq;
    INSERT INTO messages_unindexed(seq) SELECT new.seq WHERE new.status != 'streaming';
END;
""",
    # The path a conversation shows has a version (PostgreSQL's step 14): each write of `leaf_id` names
    # the version it replaces and writes the next, so that a write that lands out of order is refused.
    """
ALTER TABLE conversations ADD COLUMN path_version INTEGER NOT NULL DEFAULT 0;
""",
    # Imports as the database knows them (PostgreSQL's step 15): a running import names its owner, one at
    # a time (a claim is an insert that may conflict), and how far it got; an ended one is kept in
    # `ended_imports` for an hour, with how it ended.
    """
ALTER TABLE running_imports ADD COLUMN owner TEXT;
ALTER TABLE running_imports ADD COLUMN total INTEGER NOT NULL DEFAULT 0;
ALTER TABLE running_imports ADD COLUMN imported INTEGER NOT NULL DEFAULT 0;
ALTER TABLE running_imports ADD COLUMN dropped TEXT NOT NULL DEFAULT '{}';
CREATE UNIQUE INDEX running_imports_by_owner ON running_imports(owner);
CREATE TABLE ended_imports (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    total INTEGER NOT NULL,
    imported INTEGER NOT NULL,
    dropped TEXT NOT NULL,
    error TEXT,
    ended_at REAL NOT NULL
);
CREATE INDEX ended_imports_by_time ON ended_imports(ended_at);
""",  # The flow a conversation's turns run, by its name in flow.py's FLOWS ('': the deployment's --flow).
    """
ALTER TABLE conversations ADD COLUMN flow TEXT NOT NULL DEFAULT '';
""",  # The memory flow's facts about each user, with their vectors, and who turned memory off (store/memory.py).
    """
CREATE TABLE facts (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, text TEXT NOT NULL, vector BLOB NOT NULL, embedder TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE INDEX facts_by_owner ON facts(owner, created_at);
CREATE TABLE memory_off (owner TEXT PRIMARY KEY, since REAL NOT NULL);
""",
]


def migrate(db: sqlite3.Connection) -> None:
    """Bring the file's schema up to date, each step in its own transaction."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    db.create_function("token_hash", 1, token_hash, deterministic=True)
    for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
        db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
        logger.info("database schema upgraded to version %d", number)
    if version < len(MIGRATIONS):
        # Old versions of rows (a clear token, say) stay in the write-ahead log until it is emptied.
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
