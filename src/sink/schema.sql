-- idem Postgres sink: the records table (docs/pg_sink.md).
--
-- PgSink::migrate() applies this file under a transaction-scoped advisory lock, so many processes
-- may run it at once. It substitutes four psql-style identifiers, each quoted:
--   :"schema"         PgSinkOptions::schema                       (default public)
--   :"table"          PgSinkOptions::table                        (default idem_records)
--   :"versions"       <table>_versions: which migrations ran
--   :"expires_index"  <table>_expires_at_idx
-- A DBA can apply it by hand, in one transaction, with the same names, once the schema exists:
--   psql -1 -v schema=public -v table=idem_records -v versions=idem_records_versions \
--        -v expires_index=idem_records_expires_at_idx -f schema.sql
-- Every statement is idempotent. migrate() creates the schema when it is missing, runs the
-- preamble when the versions table is missing, then each "-- idem:migration N" block whose N is
-- above the highest version recorded; so once everything is applied, migrate() needs no CREATE
-- privilege. New blocks are appended, never edited.

CREATE TABLE IF NOT EXISTS :"schema".:"versions" (
  version    integer     PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- idem:migration 1
-- One row per (namespace, idempotency key). The primary key is the UNIQUE index that decides.
CREATE TABLE IF NOT EXISTS :"schema".:"table" (
  ns              text        NOT NULL,            -- namespace (service or tenant)
  key             text        NOT NULL,            -- encoded idempotency key
  request_id      varchar(64) NOT NULL,            -- request ID of the claim ('' when none)
  fingerprint     text        NOT NULL,            -- payload fingerprint ('' when none)
  state           text        NOT NULL DEFAULT 'in_progress'
                              CHECK (state IN ('in_progress', 'completed')),
  response        bytea,                           -- stored response (NULL when over the cap)
  response_sha256 text,                            -- hex SHA-256 of a response over the cap
  created_at      timestamptz NOT NULL DEFAULT now(),
  expires_at      timestamptz NOT NULL,            -- lease or retention end; purge after it
  PRIMARY KEY (ns, key)
);
CREATE INDEX IF NOT EXISTS :"expires_index" ON :"schema".:"table" (expires_at);
INSERT INTO :"schema".:"versions" (version) VALUES (1) ON CONFLICT DO NOTHING;

-- idem:migration 2
-- Fencing per attempt: the owner token of the attempt that claimed the row (the request ID for
-- rows claimed before, and by callers that give no token; '' for a transaction's completed
-- record). complete, release and renew of a non-transactional claim check it, so an earlier
-- attempt of the same request never completes or releases a later attempt's takeover.
ALTER TABLE :"schema".:"table" ADD COLUMN IF NOT EXISTS owner_token text NOT NULL DEFAULT '';
UPDATE :"schema".:"table" SET owner_token = request_id
  WHERE owner_token = '' AND state = 'in_progress';
INSERT INTO :"schema".:"versions" (version) VALUES (2) ON CONFLICT DO NOTHING;
