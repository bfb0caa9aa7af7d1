//! Operators' view of the job table: list, inspect, retry, cancel, discard, count.
