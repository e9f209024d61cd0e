//! The retry delays of steward's long-running loops: exponential, doubling
//! from a first delay up to a cap, no jitter, never giving up. Built on
//! `backon`; [`Backoff`] hands out one delay per failure and starts over
//! after a success, for loops that also watch a stop signal or a socket
//! between attempts (which `backon`'s `retry` adaptor cannot express).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays `first, 2·first, 4·first, …` capped at `max`, without end.
pub fn doubling(first: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(first.min(max))
        .with_max_delay(max)
        .with_factor(2.0)
        .without_max_times()
}

/// A resettable sequence of retry delays.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    max: Duration,
    delays: ExponentialBackoff,
}

impl Backoff {
    /// Doubling from `first` up to `max` (see [`doubling`]).
    pub fn doubling(first: Duration, max: Duration) -> Self {
        let builder = doubling(first, max);
        Self {
            builder,
            max,
            delays: builder.build(),
        }
    }

    /// The pause before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // The builder never gives up; `max` only guards the impossible end.
        let d = self.delays.next().unwrap_or(self.max);
        // backon multiplies in f32 (400 ms comes out as 400.000006 ms):
        // round to whole microseconds so the delays are exactly the doubled ones.
        let micros = (d.as_nanos() + 500) / 1000;
        Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)).min(self.max)
    }

    /// Starts over from the first delay (after a success).
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_starts_over_on_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::doubling(ms(200), ms(1000));
        let got: Vec<_> = (0..6).map(|_| b.next_delay()).collect();
        assert_eq!(
            got,
            [ms(200), ms(400), ms(800), ms(1000), ms(1000), ms(1000)]
        );
        b.reset();
        assert_eq!(b.next_delay(), ms(200));
    }

    #[test]
    fn a_first_delay_above_the_cap_is_capped() {
        let mut b = Backoff::doubling(Duration::from_secs(9), Duration::from_secs(2));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
    }
}
