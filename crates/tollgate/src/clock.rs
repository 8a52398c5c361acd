//! Time and randomness, injected: nothing in the limiter reads the system clock or a global
//! RNG outside these adapters.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A source of "now" in epoch milliseconds.
pub trait Clock: Send + Sync {
    /// Now, in epoch ms.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    /// Read on every acquire (two or three times): `std`'s clock and integer arithmetic,
    /// not `jiff::Timestamp::now`, whose range-checked conversion cost ~250 instructions a
    /// read. A clock set before 1970 reads as negative milliseconds, as jiff's did.
    fn now_ms(&self) -> i64 {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => epoch_ms(d),
            Err(e) => -epoch_ms(e.duration()),
        }
    }
}

/// Whole milliseconds of `d` (truncated), saturating far past any real clock (the
/// crate's usual conversion of a `Duration`, as the builder's TTLs make).
fn epoch_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A clock that moves only when told to (tests, simulation).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `ms`.
    pub fn new(ms: i64) -> Self {
        ManualClock(AtomicI64::new(ms))
    }
    /// Set the time.
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }
    /// Move forward (or back, with a negative delta).
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Shard draws: uniform in `[lo, hi)`. Never a hash of the request (ADR-134).
pub trait ShardRng: Send + Sync {
    /// A shard index in `[lo, hi)`; `hi > lo`.
    fn draw(&self, lo: u32, hi: u32) -> u32;
}

/// A seeded uniform RNG.
#[derive(Debug)]
pub struct SeededRng(Mutex<SmallRng>);

impl SeededRng {
    /// From a seed.
    pub fn new(seed: u64) -> Self {
        SeededRng(Mutex::new(SmallRng::seed_from_u64(seed)))
    }
}

impl ShardRng for SeededRng {
    fn draw(&self, lo: u32, hi: u32) -> u32 {
        if hi <= lo + 1 {
            return lo;
        }
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.gen_range(lo..hi)
    }
}

/// A draw pinned to one shard (clamped into the range), for tests that stage exact states.
#[derive(Debug, Default)]
pub struct PinnedRng(std::sync::atomic::AtomicU32);

impl PinnedRng {
    /// Pinned to `shard`.
    pub fn new(shard: u32) -> Self {
        PinnedRng(std::sync::atomic::AtomicU32::new(shard))
    }
    /// Re-pin.
    pub fn pin(&self, shard: u32) {
        self.0.store(shard, Ordering::SeqCst);
    }
}

impl ShardRng for PinnedRng {
    fn draw(&self, lo: u32, hi: u32) -> u32 {
        self.0
            .load(Ordering::SeqCst)
            .clamp(lo, hi.saturating_sub(1).max(lo))
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;

    #[test]
    fn the_system_clock_reads_as_jiff_does() {
        let before = jiff::Timestamp::now().as_millisecond();
        let ours = SystemClock.now_ms();
        let after = jiff::Timestamp::now().as_millisecond();
        assert!(
            before <= ours && ours <= after,
            "{before} <= {ours} <= {after}"
        );
    }

    #[test]
    fn durations_become_whole_milliseconds() {
        use std::time::Duration;
        assert_eq!(
            epoch_ms(Duration::new(1_796_633_730, 246_999_999)),
            1_796_633_730_246
        );
        assert_eq!(epoch_ms(Duration::ZERO), 0);
        assert_eq!(-epoch_ms(Duration::from_micros(1_500)), -1);
        assert_eq!(epoch_ms(Duration::MAX), i64::MAX);
    }
}
