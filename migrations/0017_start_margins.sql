-- How late after its claim each logged start may come, in ms: the margin of the
-- runtime that claimed it (a hundredth of the rate's window, from 50 ms to 1 s, plus
-- twice that runtime's recent claim round trip, at most 10 s in all). An executor
-- hands back, unstarted, a job it could not start within its claim's margin; a claim
-- counts every start of the window before it whose claim, plus its margin, falls
-- within that window. With one margin for every runtime, a runtime whose claims took
-- longer than it (a distant database) handed back every job of a rated kind.
-- Rows logged before this migration by older runtimes take 1 s, the most they used.
-- A constant default: nothing is rewritten.
ALTER TABLE jobs_starts ADD COLUMN margin_ms integer NOT NULL DEFAULT 1000;
