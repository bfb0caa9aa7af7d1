-- A job made pending inside a transaction that commits late is re-stamped at its
-- commit: its run-after (the statement's start) becomes the moment the commit's
-- deferred triggers run, so the claims, whose scans start at a floor a little behind
-- the latest run-after they took, find it at once, as a job committed at once. Without
-- it, such a row lies behind every runtime's floors when it becomes visible, and is
-- found only by a look back from the time its transaction began writing, over every
-- entry of the jobs claimed since (21 ms for a commit 60 s late at 2,000 jobs/s: that
-- transaction itself holds the vacuum horizon, so none of them can be marked dead).
-- The runtimes still look back so (beside their claims, not in them) for what this
-- does not re-stamp.
--
-- At the commit, `statement_timestamp()` is the start of the statement that commits:
-- `COMMIT` itself in a transaction block; in a statement on its own (which commits
-- when it ends), that statement, which began with its transaction. A row is re-stamped
-- only in a transaction block that has run more than 50 ms, and only if its run-after
-- is more than 50 ms older than the `COMMIT`: the claims' floors stay 100 ms behind
-- the latest run-after they took, so a row committed sooner is not behind them. A
-- statement on its own is never re-stamped, however long it ran (its run-afters date
-- from its start, and a run-after written in the past stays so); nor is a run-after in
-- the future (a delayed job). The update it makes does not queue another
-- (`pg_trigger_depth`). What it costs: a trigger event per row made pending, and one
-- more update of each row that a late commit made pending.
CREATE FUNCTION jobs_restamp_late_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF statement_timestamp() > transaction_timestamp() + interval '50 milliseconds'
       AND NEW.run_after < statement_timestamp() - interval '50 milliseconds' THEN
        -- The table by its schema: the committing session's search_path may not
        -- name it (a rare path: planned each time).
        EXECUTE format(
            'UPDATE %I.%I SET run_after = clock_timestamp()
             WHERE id = $1 AND state = ''pending''
               AND run_after < statement_timestamp() - interval ''50 milliseconds''',
            TG_TABLE_SCHEMA, TG_TABLE_NAME)
        USING NEW.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER jobs_late_commit
    AFTER INSERT OR UPDATE OF run_after ON jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.state = 'pending' AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION jobs_restamp_late_commit();
