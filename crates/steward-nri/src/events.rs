//! NRI's event mask: which calls a plugin subscribes to (Configure's answer).

use crate::proto::nri::Event;

/// A set of [`Event`]s: bit `e - 1` for event `e`, as upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventMask(pub i32);

impl EventMask {
    /// Every event NRI v0.8.0 defines (what the runtime assumes for 0).
    pub const ALL: Self = Self((1 << (Event::Last as i32 - 1)) - 1);

    /// The mask of the given events.
    pub fn of(events: &[Event]) -> Self {
        let mut m = Self::default();
        for e in events {
            m = m.with(*e);
        }
        m
    }

    /// This mask plus `e`.
    pub fn with(self, e: Event) -> Self {
        let n = e as i32;
        if (1..Event::Last as i32).contains(&n) {
            Self(self.0 | (1 << (n - 1)))
        } else {
            self
        }
    }

    /// Whether `e` is in the mask.
    pub fn contains(self, e: Event) -> bool {
        let n = e as i32;
        (1..Event::Last as i32).contains(&n) && self.0 & (1 << (n - 1)) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream: `ValidEvents = (1 << (Event_LAST - 1)) - 1`, bit e-1 per event.
    #[test]
    fn mask_bits_are_upstreams() {
        assert_eq!(EventMask::ALL.0, 0x7ff);
        let m = EventMask::of(&[Event::RunPodSandbox, Event::CreateContainer]);
        assert_eq!(m.0, 0b1001);
        assert!(m.contains(Event::CreateContainer));
        assert!(!m.contains(Event::StopContainer));
        assert_eq!(EventMask::default().with(Event::Unknown).0, 0);
        assert_eq!(EventMask::default().with(Event::Last).0, 0);
    }
}
