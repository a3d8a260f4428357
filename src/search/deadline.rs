//! `Deadline`: the one wall-clock budget of a planning command (`--time-limit`).
//!
//! Saturation, e-node choice, the fusion searches, the ILP and the plan's own bookkeeping all
//! read the same deadline: each stage takes a share of what is left when it starts and checks
//! [`Deadline::expired`] in its loops, so when time runs out the command returns the best
//! complete plan found so far (at worst the unfused one) and says which stage the limit cut.
//! Invariant: a deadline only shortens searches; reaching it is a result, never an error.

use std::time::{Duration, Instant};

/// A point in time after which planning stops searching, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    end: Option<Instant>,
}

impl Deadline {
    /// No deadline: every search runs to its own end.
    pub fn never() -> Deadline {
        Deadline { end: None }
    }

    /// A deadline `limit` from now (none if that is past what the clock can name).
    pub fn after(limit: Duration) -> Deadline {
        Deadline { end: Instant::now().checked_add(limit) }
    }

    /// Whether the deadline has passed.
    pub fn expired(&self) -> bool {
        self.end.is_some_and(|e| Instant::now() >= e)
    }

    /// Time left (`Duration::MAX` without a deadline).
    pub fn remaining(&self) -> Duration {
        self.end.map_or(Duration::MAX, |e| e.saturating_duration_since(Instant::now()))
    }

    /// A deadline `share` (0 to 1) of the time left from now, never later than this one.
    pub fn share(&self, share: f64) -> Deadline {
        match self.end {
            None => Deadline::never(),
            Some(_) => Deadline::after(self.remaining().mul_f64(share.clamp(0.0, 1.0))),
        }
    }
}

/// Checks a deadline every `every` calls, so that hot loops read the clock rarely.
#[derive(Debug)]
pub struct Ticker {
    deadline: Deadline,
    every: u32,
    count: u32,
    hit: bool,
}

impl Ticker {
    pub fn new(deadline: Deadline, every: u32) -> Ticker {
        Ticker { deadline, every: every.max(1), count: 0, hit: false }
    }

    /// Whether the deadline has passed (read from the clock every `every` calls; once it has
    /// passed, always true).
    pub fn expired(&mut self) -> bool {
        if self.hit {
            return true;
        }
        self.count += 1;
        if self.count >= self.every {
            self.count = 0;
            self.hit = self.deadline.expired();
        }
        self.hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_expire_and_share() {
        assert!(!Deadline::never().expired());
        assert_eq!(Deadline::never().remaining(), Duration::MAX);
        assert!(Deadline::after(Duration::ZERO).expired());
        let d = Deadline::after(Duration::from_secs(3600));
        assert!(!d.expired());
        assert!(d.share(0.5).remaining() <= Duration::from_secs(1800));
        // A limit past what the clock can name is no deadline, not a panic.
        assert!(!Deadline::after(Duration::MAX).expired());
        let mut t = Ticker::new(Deadline::after(Duration::ZERO), 3);
        assert!(!t.expired() && !t.expired());
        assert!(t.expired() && t.expired());
    }
}
