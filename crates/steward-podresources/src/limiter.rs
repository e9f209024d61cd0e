//! A token bucket, as kubelet limits its pod resources endpoint
//! (`golang.org/x/time/rate` with 100 qps and a burst of 10 by default).
//! Time is passed in, so the bucket is deterministic under test.

use std::time::{Duration, Instant};

/// kubelet's defaults.
pub const DEFAULT_QPS: f64 = 100.0;
pub const DEFAULT_BURST: u32 = 10;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps <= 0` disables the limit.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        Self {
            qps,
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            last: now,
        }
    }

    /// Takes one token if there is one.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if self.qps <= 0.0 {
            return true;
        }
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until a token is there (zero if one is).
    pub fn wait_hint(&self) -> Duration {
        if self.qps <= 0.0 || self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - self.tokens) / self.qps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_qps() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 10, t0);
        assert_eq!((0..20).filter(|_| b.try_take(t0)).count(), 10);
        assert!(b.wait_hint() > Duration::ZERO);
        // 100 qps: one token every 10 ms.
        assert!(b.try_take(t0 + Duration::from_millis(10)));
        assert!(!b.try_take(t0 + Duration::from_millis(11)));
        // Never more than the burst after a long pause.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| b.try_take(later)).count(), 10);
    }

    #[test]
    fn zero_qps_means_unlimited() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0.0, 1, t0);
        assert!((0..1000).all(|_| b.try_take(t0)));
    }
}
