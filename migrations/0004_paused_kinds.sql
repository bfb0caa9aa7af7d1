-- Kinds an operator has paused (`jobs::admin::pause`): no runtime claims them until
-- they are resumed; enqueues go on. Runtimes read this small table once per poll
-- interval, so the claim statement itself is unchanged for kinds that are not paused.
CREATE TABLE jobs_paused (
    kind      text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
