"""The SQL every dialect shares, as named statements with a few dialect slots.

Each statement is written out as SQL. Where databases differ, a ``{slot}`` names what
differs and the dialect fills it once (``Dialect`` documents each fragment):

- ``{now}``: the database's clock, read inside the statement (``Dialect.now_sql``);
- ``{lease_expiry}``: "N seconds from now", read when the row is written;
- ``{skip_locked}``: skips rows another claim holds, where the database can;
- ``{served}``: the served queues as rows of (backend_name, queue_name);
- ``{json}``: a parameter of JSON text read as the column's JSON type.

Names are written as the models name them, unquoted: the models set no ``db_table`` or
``db_column`` (``tests/test_architecture.py`` holds them to that). Statuses are literals,
not parameters, so the planner can match the partial indexes (``status = 'READY'``).
"""

from __future__ import annotations

TASKS = "django_tasks_plus_taskrecord"
DEDUP_KEYS = "django_tasks_plus_dedupkey"

# Columns a claim (and the reaper's read) returns, in this order: ``claimed_from_row``
# decodes them.
CLAIM_COLUMNS = (
    "id",
    "task_path",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "attempt",
    "worker_ids",
    "errors",
    "enqueued_at",
    "run_after",
    "started_at",
    "lease_token",
    "backend_name",
    "ordering_key",
    "requested_run_after",
    "held_since",
    "breaker_key",
    "metadata",
)

# A keyed candidate may run only when no earlier task of its key is still pending (READY,
# RUNNING, or dead-lettered under ordering_failure='block') and none of its key is running.
# "Earlier" includes a row a concurrent claim has locked, so two workers never pick two
# tasks of one key; the unique index dtp_task_one_running_key backs this up.
ORDERING_HEAD = """(
        candidate.ordering_key IS NULL OR (
            NOT EXISTS (
                SELECT 1 FROM django_tasks_plus_taskrecord earlier
                WHERE earlier.backend_name = candidate.backend_name
                  AND earlier.ordering_key = candidate.ordering_key
                  AND earlier.sequence < candidate.sequence
                  AND (earlier.status IN ('READY', 'RUNNING')
                       OR (earlier.status = 'FAILED' AND earlier.ordering_blocked))
            )
            AND NOT EXISTS (
                SELECT 1 FROM django_tasks_plus_taskrecord running
                WHERE running.backend_name = candidate.backend_name
                  AND running.ordering_key = candidate.ordering_key
                  AND running.status = 'RUNNING'
            )
        )
    )"""

# The ids a claim takes: due READY tasks of one backend and its queues, each at the head of
# its ordering key, in claim order (priority, due time, id), without walking rows the claim
# will not take. The READY tasks of one backend and queue at one priority sit together in
# the partial index dtp_task_claim_idx, due ones first; so the claim lists each served
# queue's priority levels (CLAIM_LEVELS: one index probe per level present, a loose index
# scan), takes up to LIMIT due rows from each level (an index range that ends at the first
# later run_after) and merges them. Tasks due later, at any priority, and tasks of queues
# not served cost one probe per level, whatever their number.
# {served}: a row source of (backend_name, queue_name), one row per served queue, taking
# the backend name and the queues as parameters.
CLAIM_LEVELS = """levels AS (
            SELECT served.backend_name, served.queue_name, (
                SELECT max(level.priority) FROM django_tasks_plus_taskrecord level
                WHERE level.status = 'READY'
                  AND level.backend_name = served.backend_name
                  AND level.queue_name = served.queue_name
            ) AS priority
            FROM {served} served
            UNION ALL
            SELECT levels.backend_name, levels.queue_name, (
                SELECT max(level.priority) FROM django_tasks_plus_taskrecord level
                WHERE level.status = 'READY'
                  AND level.backend_name = levels.backend_name
                  AND level.queue_name = levels.queue_name
                  AND level.priority < levels.priority
            )
            FROM levels WHERE levels.priority IS NOT NULL
        )"""

# The due rows of one level (``levels``), in claim order: {conditions} are the registered
# claim filters (``extensions.claim_filters``), each "AND (fragment)", empty when none is
# registered; {skip_locked} locks the rows taken, skipping those another claim holds.
LEVEL_ROWS = """
            SELECT candidate.id, candidate.priority, candidate.run_after
            FROM django_tasks_plus_taskrecord candidate
            WHERE candidate.status = 'READY'
              AND candidate.backend_name = levels.backend_name
              AND candidate.queue_name = levels.queue_name
              AND candidate.priority = levels.priority
              AND candidate.run_after <= {now}
              AND {ordering_head}{conditions}
            ORDER BY candidate.run_after, candidate.id
            LIMIT %s{skip_locked}"""

# The candidates where the database joins LATERAL (PostgreSQL): each level's rows, merged.
# Each level locks at most LIMIT rows; the merge keeps the first LIMIT of them all, and the
# others' locks end with the claim's statement.
# Parameters: {served}'s (backend name, queues), the filters', the limit (twice).
CLAIM_CANDIDATES_LATERAL = """
        WITH RECURSIVE {levels}
        SELECT candidate.id FROM levels CROSS JOIN LATERAL ({level_rows}
        ) candidate
        WHERE levels.priority IS NOT NULL
        ORDER BY candidate.priority DESC, candidate.run_after, candidate.id
        LIMIT %s
"""

# The candidates where the database has no LATERAL but correlates a sub-select (SQLite):
# a task is taken when it is among its level's first rows.
# Parameters: {served}'s (backend name, queues), the filters', the limit (twice).
CLAIM_CANDIDATES_CORRELATED = """
        WITH RECURSIVE {levels}
        SELECT taken.id FROM levels JOIN django_tasks_plus_taskrecord taken
          ON taken.id IN (SELECT id FROM ({level_rows}
          ))
        WHERE levels.priority IS NOT NULL
        ORDER BY taken.priority DESC, taken.run_after, taken.id
        LIMIT %s
"""

# Extend every lease still held, in one statement, for a database that locks no single
# rows (SQLite locks the whole database): {lease_expiry} is read when the row is written,
# after any wait for the database's lock, so a renewal that waited still grants a whole
# lease. A database with row locks must skip a locked row rather than wait for it, and
# still count it held (postgresql.RENEW_LEASES_SKIPPING_LOCKED). Returns the (id, token)
# pairs renewed; the caller counts the others as lost (one statement, so a task that
# finishes meanwhile is never mistaken for a lost lease by a second look).
# Parameters: the expiry's, the ids ({ids} placeholders), the tokens ({tokens}).
RENEW_LEASES = """
    UPDATE django_tasks_plus_taskrecord SET lease_expires_at = {lease_expiry}
    WHERE id IN (
        SELECT id FROM django_tasks_plus_taskrecord
        WHERE id IN ({ids}) AND lease_token IN ({tokens}) AND status = 'RUNNING'
    )
    RETURNING id, lease_token
"""

# The reaper's work: running tasks of a backend whose lease ran out by the database's
# clock, oldest expiry first (the partial index dtp_task_lease_idx). Read as plain columns
# and decoded by ``claimed_from_row``, so a hostile JSON column reads as corrupt, never
# raises. Parameters: backend name, limit.
EXPIRED_TASKS = """
    SELECT {claim_columns} FROM django_tasks_plus_taskrecord
    WHERE backend_name = %s AND status = 'RUNNING' AND lease_expires_at < {now}
    ORDER BY lease_expires_at
    LIMIT %s
"""

# Take a dedup key unless a row holds it: the unique constraint settles races (a concurrent
# taker waits for the holder's transaction, then sees its row). Returns the new row's id,
# or no row when the key was held. Parameters: backend, key, task ids (JSON text),
# expires_at, until_finished, created_at.
INSERT_DEDUP_KEY = """
    INSERT INTO django_tasks_plus_dedupkey
        (backend_name, "key", task_ids, expires_at, until_finished, created_at)
    VALUES (%s, %s, {json}, %s, %s, %s)
    ON CONFLICT (backend_name, "key") DO NOTHING
    RETURNING id
"""


def claim_candidates(
    template: str, *, served: str, now: str, skip_locked: str = "", conditions: str = ""
) -> str:
    """A claim's candidates (``CLAIM_CANDIDATES_LATERAL`` or ``CLAIM_CANDIDATES_CORRELATED``)
    with a dialect's fragments (``skip_locked`` starts with a newline and its indentation,
    or is empty) and the claim filters' ``conditions`` (``extensions.claim_conditions``)."""
    return template.format(
        levels=CLAIM_LEVELS.format(served=served),
        level_rows=LEVEL_ROWS.format(
            now=now, skip_locked=skip_locked, ordering_head=ORDERING_HEAD, conditions=conditions
        ),
    )


def placeholders(count: int) -> str:
    """``%s, %s, …``: one placeholder per value of an ``IN (…)`` list."""
    return ", ".join(["%s"] * count)
