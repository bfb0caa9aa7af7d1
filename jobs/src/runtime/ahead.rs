//! Claims ahead of free slots: each kind's recent rate of ended claims, and what it
//! may claim ahead of its free slots accordingly.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::Shared;

/// How much work a kind claims ahead of its free slots: what its handlers finish in this
/// long at their recent rate, or in two claims' time when claims take longer (a slow or
/// busy database): the work ahead then lasts until the next claim's rows arrive. Short
/// jobs come in claims of hundreds however low the concurrency; a kind whose jobs take
/// longer than this claims nothing ahead, so that claims never wait long in one runtime
/// while another has free slots.
const AHEAD_FOR: Duration = Duration::from_millis(50);

/// At most this many claims held ahead of free slots, over all kinds. A claim is sent
/// once half of what the runtime may hold is free, so a fast kind at concurrency 10
/// comes in claims of 530 to 800 on average over a drain (the claims ahead follow the
/// measured rate, from none at its start; a claim takes at most 1,000 of a kind), one
/// claim's rows starting while the next claim is in flight (`super::producer`). With 1,000 ahead,
/// claims of about 370 drained W2 up to a tenth slower, and two runtime processes (W5)
/// slower than before the rows started beside the next claim; with 500 ahead, before
/// that change, claims of 250 drained W2 a tenth slower than 1,000 (BENCHMARKS.md).
const MAX_AHEAD: usize = 2_000;

/// How often the rates behind the claim-ahead are measured.
const RATE_EVERY: Duration = Duration::from_millis(100);

/// Each kind's recent rate of ended claims, and what it may claim ahead of its free
/// slots accordingly (`AHEAD_FOR` of work, `MAX_AHEAD` in all).
pub(super) struct Rates {
    at: Instant,
    ended: HashMap<&'static str, u64>,
    /// Claims ended per second, smoothed over the last few measurements.
    rate: HashMap<&'static str, f64>,
    pub(super) ahead: HashMap<&'static str, usize>,
    /// The sum of `ahead`.
    pub(super) total: usize,
    /// How long claims take, smoothed.
    claim_took: Duration,
}

impl Rates {
    pub(super) fn new(shared: &Shared) -> Self {
        Rates {
            at: Instant::now(),
            ended: shared.ended(),
            rate: HashMap::new(),
            ahead: HashMap::new(),
            total: 0,
            claim_took: Duration::ZERO,
        }
    }

    /// Notes how long a claim that took rows took, from its sending to its answer.
    pub(super) fn claimed(&mut self, took: Duration) {
        self.claim_took = (self.claim_took + took) / 2;
    }

    /// Measures the rates again if `RATE_EVERY` has passed.
    pub(super) fn measure(&mut self, shared: &Shared) {
        let elapsed = self.at.elapsed();
        if elapsed < RATE_EVERY {
            return;
        }
        let ended = shared.ended();
        let horizon = AHEAD_FOR.max(2 * self.claim_took).as_secs_f64();
        let mut wanted = Vec::new();
        for (kind, n) in &ended {
            let done = n - self.ended.get(kind).copied().unwrap_or(0);
            let now = done as f64 / elapsed.as_secs_f64();
            let rate = self.rate.entry(kind).or_insert(now);
            *rate = (*rate + now) / 2.0;
            wanted.push((*kind, (*rate * horizon) as usize));
        }
        // Over the cap, every kind's share shrinks in proportion.
        let sum: usize = wanted.iter().map(|(_, n)| n).sum();
        self.ahead = wanted
            .into_iter()
            .map(|(kind, n)| {
                let n = if sum > MAX_AHEAD {
                    n * MAX_AHEAD / sum
                } else {
                    n
                };
                (kind, n)
            })
            .collect();
        self.total = self.ahead.values().sum();
        self.at = Instant::now();
        self.ended = ended;
    }
}
