"""Schema history: an append-only list of named migrations, recorded in the database.

Never edit or reorder a migration that has shipped; add a new one. A store that records a
migration this list does not know was written by a newer aiq and is refused.

Why the keys look as they do: ``aiq add`` must take 100,000 lines/s. Rows are appended in
rowid order (cheap) and deduplicated through small unique integer indexes (the first 8 bytes
of a digest) rather than a 32-byte blob or a text key; the full digest is kept beside it.
Those indexes take random inserts, so every commit rewrites most of their pages: `add`
commits rarely for that reason (see enqueue.py).
"""

from __future__ import annotations

# -- 0008_tallies's triggers: frozen with it, like its text (a later change is a new migration).
_KEY = "CASE {row}.state WHEN 1 THEN 0 ELSE {row}.state END"  # queued and running: one
_NONE = "x'00'"  # a NULL key column in the unique index (a plain UNIQUE lets NULLs repeat)
_SUMMED = (
    "tokens_in", "tokens_out", "tokens_cached", "tokens_cache_write", "tokens_cache_read",
    "tokens_reasoning",
)  # fmt: skip
_TALLIED = ("model", "error_type", "timeouts", "cost_usd", *_SUMMED)


def _tally(row: str, sign: str, keys: tuple[str, ...] = ("model", "error_type")) -> str:
    """The statement adding (``+``) or taking off (``-``) one job (``NEW`` or ``OLD``) to or
    from its tally, creating the tally when there is none; ``keys``: the tally's key after
    its state (0011_tiers adds the tier)."""
    figures = {
        "jobs": "1",
        "usable": f"{row}.tokens_in IS NOT NULL",
        "priced": f"{row}.cost_usd IS NOT NULL",
        "cost_usd": f"coalesce({row}.cost_usd, 0)",
        "timeouts": f"{row}.timeouts",
        **{c: f"coalesce({row}.{c}, 0)" for c in _SUMMED},
    }
    return (
        f"INSERT INTO tallies (state, {', '.join(keys)}, {', '.join(figures)}) "
        f"SELECT {_KEY.format(row=row)}, {', '.join(f'{row}.{k}' for k in keys)}, "
        f"{', '.join(f'{sign}({v})' for v in figures.values())} WHERE true "
        f"ON CONFLICT (state, {', '.join(f'ifnull({k}, {_NONE})' for k in keys)}) "
        f"DO UPDATE SET {', '.join(f'{c} = {c} + excluded.{c}' for c in figures)};"
    )


# -- 0011_tiers's: the tally's key and what is tallied gain the tier.
_KEYS_0011 = ("model", "error_type", "tier")
_TALLIED_0011 = (*_TALLIED, "tier")


MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_initial",
        """
        CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);

        CREATE TABLE sources (
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL UNIQUE,      -- resolved path of the input file
            out_path TEXT NOT NULL,
            dead_path TEXT NOT NULL,
            added_at REAL NOT NULL
        );

        -- One row per distinct request (endpoint + body): it is sent at most once.
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            k64 INTEGER NOT NULL UNIQUE,    -- first 8 bytes of key, as a signed integer
            key BLOB NOT NULL,              -- full sha256 job key
            endpoint TEXT NOT NULL,
            body BLOB NOT NULL,             -- canonical JSON, exactly what is sent
            state INTEGER NOT NULL DEFAULT 0,  -- 0 queued, 1 running, 2 done, 3 dead
            attempts INTEGER NOT NULL DEFAULT 0,
            next_at REAL NOT NULL DEFAULT 0,   -- not claimed before this (unix seconds)
            lease_until REAL,
            created_at REAL NOT NULL,
            first_attempt_at REAL,
            finished_at REAL,
            status_code INTEGER,
            error_type TEXT,
            error_message TEXT,
            request_id TEXT,
            response BLOB,                  -- the provider's reply body, as received
            tokens_in INTEGER,
            tokens_out INTEGER,
            latency_s REAL
        );
        CREATE INDEX jobs_state_next ON jobs (state, next_at);

        -- One row per (input file, custom_id): what the user asked for, pointing at a job.
        CREATE TABLE items (
            id INTEGER PRIMARY KEY,
            source_id INTEGER NOT NULL REFERENCES sources (id),
            ck INTEGER NOT NULL,            -- inputs.custom_id_hash(custom_id)
            custom_id TEXT NOT NULL,
            job_k64 INTEGER NOT NULL,
            line_no INTEGER NOT NULL,
            line BLOB NOT NULL,             -- the original input line
            UNIQUE (source_id, ck)
        );

        -- A custom_id re-pointed to a new request may leave its old job wanted by no item.
        -- The trigger only notes it (rare, cheap); enqueue drops such jobs unless they ran.
        -- No index on items.job_k64: it would cost `add` a third of its speed.
        CREATE TABLE repointed (k64 INTEGER NOT NULL);
        CREATE TRIGGER items_repoint AFTER UPDATE OF job_k64 ON items
        BEGIN
            INSERT INTO repointed (k64) VALUES (OLD.job_k64);
        END;

        -- What the last completed `add` of a source read (requestfile.Prefix): when the file still
        -- starts with those bytes, the next `add` reads only what follows them.
        CREATE TABLE prefixes (
            source_id INTEGER PRIMARY KEY REFERENCES sources (id),
            size INTEGER NOT NULL,          -- bytes of whole lines
            sha256 BLOB NOT NULL,           -- of those bytes
            lines INTEGER NOT NULL,
            valid INTEGER NOT NULL,
            bad BLOB NOT NULL,              -- JSON {"invalid": n, "lines": [[line_no, why], …]}
            ids BLOB NOT NULL,              -- custom_id hashes, 8 bytes each, little endian
            rules TEXT NOT NULL             -- fingerprint of parse rules and defaults
        );
        """,
    ),
    (
        # Cost accounting. The model is written with the outcome, from the body that was sent,
        # not at enqueue: `add` stays as fast as it was, and status groups by a plain column
        # instead of parsing every body. cost_usd is priced when the reply comes in (NULL:
        # the model had no price then), so a later price change does not rewrite history.
        "0002_cost",
        """
        ALTER TABLE jobs ADD COLUMN model TEXT;
        ALTER TABLE jobs ADD COLUMN cost_usd REAL;
        -- Jobs done before this migration: their model, at least, from the body they sent.
        UPDATE jobs SET model = json_extract(CAST(body AS TEXT), '$.model') WHERE state = 2;
        """,
    ),
    (
        # A queued job with deferred = 1 was put back by the rate limiter of its model, with
        # next_at at the slot that limiter could give it, so the run's senders could send
        # other models' jobs meanwhile. Not a retry: the next run brings it forward, since
        # its limits may have changed (JobStore.undefer).
        "0003_deferred",
        """
        ALTER TABLE jobs ADD COLUMN deferred INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (
        # When the request of a running job last went out (JobStore.claim's ``sent``); NULL
        # while it is only claimed, waiting for a sender or its rate limit. So `status` tells
        # requests in flight from jobs claimed ahead. Marked in the write that already counts
        # the attempt, cleared by the claim: no extra statement on the worker's path.
        "0004_sent_at",
        """
        ALTER TABLE jobs ADD COLUMN sent_at REAL;
        """,
    ),
    (
        # Lines without a custom_id were named after their request, k-<first 24 hex digits of
        # the job key>, so identical lines shared one item and one result line, and a result
        # could not be joined back to its line. They are named line-<line number> now: the
        # items named the old way are renamed (an item named so by the user's own line is too,
        # as its name matches the key only if copied from aiq's output: not worth a scan of
        # the file). An identical line that had no item of its own gets one at the next add,
        # which reads the whole file again (inputs.RULES_VERSION 4). OR IGNORE: a line-N the
        # user gave another line of the same file keeps it, and the old name stays.
        "0005_line_ids",
        """
        UPDATE OR IGNORE items
        SET custom_id = 'line-' || line_no, ck = aiq_custom_id_hash('line-' || line_no)
        WHERE custom_id GLOB 'k-*' AND length(custom_id) = 26
          AND substr(custom_id, 3) = (
            SELECT lower(hex(substr(j.key, 1, 12))) FROM jobs j WHERE j.k64 = items.job_k64
          );
        """,
    ),
    (
        # How many of a job's calls got no reply in time. Apart from its last error: a call
        # cut short may still be billed by the provider, whatever became of the job after.
        "0006_timeouts",
        """
        ALTER TABLE jobs ADD COLUMN timeouts INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (
        # A reply's tokens by kind (aiq.usage), each part of tokens_in or tokens_out: OpenAI's
        # cached input, Anthropic's cache writes and reads, reasoning. NULL in a job done
        # before this migration: none known. A done job whose tokens_in is NULL had a reply
        # with unusable usage (not counts): its tokens and cost are unknown.
        "0007_token_kinds",
        """
        ALTER TABLE jobs ADD COLUMN tokens_cached INTEGER;
        ALTER TABLE jobs ADD COLUMN tokens_cache_write INTEGER;
        ALTER TABLE jobs ADD COLUMN tokens_cache_read INTEGER;
        ALTER TABLE jobs ADD COLUMN tokens_reasoning INTEGER;
        """,
    ),
    (
        # Counts and sums by (state, model, error_type), kept by triggers as jobs change and by
        # enqueue as they are added (aiq.tallies), so `status` reads a few rows, not the jobs
        # (4.4 s at a million jobs with replies). One state stands for queued and running
        # both: a claim, a release or a deferral moves a job between those two and changes
        # no tally; the running jobs, a run's claimed few, are counted on the (state,
        # next_at) index. A done job's next_at is when it finished (JobStore._write_outcomes),
        # so the jobs done in the last minute are a range of that index too; next_at means
        # nothing else for a job that is never claimed again. The oldest queued job is the
        # first of a partial index of the queued ones.
        "0008_tallies",
        f"""
        CREATE TABLE tallies (
            state INTEGER NOT NULL,         -- 0 queued or running, 2 done, 3 dead
            model TEXT,
            error_type TEXT,
            jobs INTEGER NOT NULL,
            usable INTEGER NOT NULL,        -- jobs whose tokens_in is known
            priced INTEGER NOT NULL,        -- jobs whose cost_usd is known
            cost_usd REAL NOT NULL,
            timeouts INTEGER NOT NULL,
            tokens_in INTEGER NOT NULL,
            tokens_out INTEGER NOT NULL,
            tokens_cached INTEGER NOT NULL,
            tokens_cache_write INTEGER NOT NULL,
            tokens_cache_read INTEGER NOT NULL,
            tokens_reasoning INTEGER NOT NULL
        );
        -- One row per key, NULLs included (a plain UNIQUE lets NULLs repeat): the upserts'
        -- conflict target.
        CREATE UNIQUE INDEX tallies_key
        ON tallies (state, ifnull(model, x'00'), ifnull(error_type, x'00'));
        INSERT INTO tallies
        SELECT CASE state WHEN 1 THEN 0 ELSE state END, model, error_type, count(*),
            count(tokens_in), count(cost_usd), coalesce(sum(cost_usd), 0), sum(timeouts),
            coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0),
            coalesce(sum(tokens_cached), 0), coalesce(sum(tokens_cache_write), 0),
            coalesce(sum(tokens_cache_read), 0), coalesce(sum(tokens_reasoning), 0)
        FROM jobs GROUP BY 1, 2, 3;
        -- Only a job done in the last minute can count as recent: rewriting every done row
        -- took 40 s at a million jobs with replies.
        UPDATE jobs SET next_at = finished_at
        WHERE state = 2 AND finished_at > (julianday('now') - 2440587.5) * 86400.0 - 60;
        -- The oldest queued job for `status`: only a job entering or leaving the queue
        -- changes it, in created_at order (an add appends to its end).
        CREATE INDEX jobs_queued_created ON jobs (created_at) WHERE state = 0;

        CREATE TRIGGER jobs_tally_delete AFTER DELETE ON jobs
        BEGIN {_tally("OLD", "-")} END;
        -- Fired only by a change of what is tallied: not by a claim, a sent mark, a deferral.
        CREATE TRIGGER jobs_tally_update AFTER UPDATE OF state, {", ".join(_TALLIED)} ON jobs
        WHEN {_KEY.format(row="OLD")} != {_KEY.format(row="NEW")}
            OR {" OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _TALLIED)}
        BEGIN {_tally("OLD", "-")} {_tally("NEW", "")} END;
        """,
    ),
    (
        # A job's priority: claimed before every lower one, then as before (jobs put back to
        # wait, by when they came due, then untried ones, in input order). The line's own
        # `priority` or its file's --priority; a request many lines share takes the highest
        # (enqueue._raise_priorities). The index that served claims, (state, next_at), gains
        # priority as its last column instead of a second index beside it: untried jobs
        # (next_at 0) then come in the claim's order, highest first, and in input order
        # within one (the rowid follows), read in order with no sort; every query the old
        # index served reads its prefix. An `add` appends to one index, as before.
        # In the same migration (issue 16's, one upgrade): every failed attempt, where the
        # job row keeps only the last, for `aiq show`. A write per failure, none per success;
        # a job's are deleted with it. Jobs that failed before it have only their last error.
        "0009_priority",
        """
        ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
        DROP INDEX jobs_state_next;
        CREATE INDEX jobs_claim ON jobs (state, next_at, priority DESC);

        CREATE TABLE errors (
            job_id INTEGER NOT NULL,        -- jobs.id
            attempts INTEGER NOT NULL,      -- the job's attempts after this one
            at REAL NOT NULL,               -- when it failed (unix seconds)
            error_type TEXT,
            status_code INTEGER,
            message TEXT,                   -- as the job row keeps it: redacted
            request_id TEXT,
            state INTEGER NOT NULL          -- what became of the job: 0 retried, 3 dead
        );
        CREATE INDEX errors_job ON errors (job_id);
        CREATE TRIGGER jobs_errors_delete AFTER DELETE ON jobs
        BEGIN DELETE FROM errors WHERE job_id = OLD.id; END;
        """,
    ),
    (
        # The provider's own batch engine (aiq.batch_engine, issue 15). A batch is planned with
        # its jobs before any call, then each step's answer is written before the next call
        # (uploaded: input_file_id; created: provider_batch_id; ingested), so a run killed at
        # any instant finds what it did. A job in an open batch is running with its batch_id:
        # recover_running leaves it there (the provider has it), ingest clears it. Requeued
        # counts why lines came back without costing an attempt (expired, cancelled, missing,
        # failed), for status.
        "0010_batches",
        """
        CREATE TABLE batches (
            id INTEGER PRIMARY KEY,
            provider TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            model TEXT,
            step TEXT NOT NULL,             -- planned, uploaded, created, ingested
            state TEXT,                     -- the provider's: validating ... completed, expired
            requests INTEGER NOT NULL,
            input_file_id TEXT,
            provider_batch_id TEXT,
            output_file_id TEXT,
            error_file_id TEXT,
            counts TEXT,                    -- the provider's request_counts, as last polled
            requeued TEXT,                  -- JSON {reason: lines} once ingested
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        ALTER TABLE jobs ADD COLUMN batch_id INTEGER;
        -- Batches in a row whose output named the job nowhere: at --max-attempts it is dead,
        -- so a provider that always drops a line cannot keep a run going forever.
        ALTER TABLE jobs ADD COLUMN missing INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX jobs_batch ON jobs (batch_id) WHERE batch_id IS NOT NULL;
        """,
    ),
    (
        # The tier that billed a job's reply (contract.Tier: online, flex, batch), written with
        # its cost, so status and the summary say what each tier cost: a night half by batch
        # and half online (--via auto at its deadline) shows both. The tallies' key gains it,
        # so status still reads a few rows. NULL: no reply, or (done) before this migration,
        # when no tier was recorded; status names those "unknown": a job done before cannot
        # be told apart (a batch's jobs lose their batch_id once ingested), and reading every
        # reply to guess would rewrite every done row (40 s at a million, see 0008). Every
        # job's tier is NULL here, as is every existing tally's: nothing to count again. The
        # triggers are 0008's with the tier in the key and among what is tallied, still
        # fired only by a change of what is tallied.
        "0011_tiers",
        f"""
        ALTER TABLE jobs ADD COLUMN tier TEXT;
        ALTER TABLE tallies ADD COLUMN tier TEXT;
        DROP INDEX tallies_key;
        CREATE UNIQUE INDEX tallies_key ON tallies
        ({", ".join(["state", *(f"ifnull({k}, {_NONE})" for k in _KEYS_0011)])});
        DROP TRIGGER jobs_tally_delete;
        DROP TRIGGER jobs_tally_update;
        CREATE TRIGGER jobs_tally_delete AFTER DELETE ON jobs
        BEGIN {_tally("OLD", "-", _KEYS_0011)} END;
        CREATE TRIGGER jobs_tally_update AFTER UPDATE OF state, {", ".join(_TALLIED_0011)} ON jobs
        WHEN {_KEY.format(row="OLD")} != {_KEY.format(row="NEW")}
            OR {" OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _TALLIED_0011)}
        BEGIN {_tally("OLD", "-", _KEYS_0011)} {_tally("NEW", "", _KEYS_0011)} END;
        """,
    ),
]
