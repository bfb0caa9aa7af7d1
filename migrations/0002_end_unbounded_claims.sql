-- Transaction mode used to claim a job inside the handler's transaction, with
-- claimed_until = 'infinity' and the row lock as the lease. A handler that returned a
-- lost lease committed such a claim as it stood: the row stayed running forever, and
-- every trigger of its key became a re-run mark that never ran. Transaction mode now
-- claims under a lease that expires; this ends the claims the old shape left behind, so
-- that the rescuer takes them back (their attempt counted, a re-run mark honoured).
UPDATE jobs
SET claimed_until = now()
WHERE state = 'running' AND claimed_until = 'infinity';
