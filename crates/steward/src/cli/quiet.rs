//! The cluster commands' log: the process's subscriber minus the client
//! stack's own failure logs. kube-client logs every failed request at ERROR
//! (`failed with error client error (Connect)`), the TLS verifier every
//! refused certificate; a command reports the failure itself, as its one
//! error line, so theirs would be second, less clear lines on stderr.

use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::{Interest, Subscriber};
use tracing::{Dispatch, Event, Metadata};

/// Targets muted: kube-client's request tracing (the `HTTP` span and its
/// failure events) and the TLS certificate verifier.
const MUTED_TARGETS: [&str; 2] = ["kube_client::client::builder", "rustls_platform_verifier"];

/// The current dispatcher (the process's subscriber), without
/// [`MUTED_TARGETS`]. Apply it to a command's future with
/// `tracing::instrument::WithSubscriber::with_subscriber`.
pub fn dispatch() -> Dispatch {
    let inner = tracing::dispatcher::get_default(Dispatch::clone);
    Dispatch::new(Muted {
        inner,
        max_level: LevelFilter::current(),
    })
}

struct Muted {
    inner: Dispatch,
    max_level: LevelFilter,
}

fn muted(meta: &Metadata<'_>) -> bool {
    MUTED_TARGETS.iter().any(|t| meta.target().starts_with(t))
}

impl Subscriber for Muted {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if muted(meta) {
            Interest::never()
        } else {
            self.inner.register_callsite(meta)
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max_level)
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        !muted(meta) && self.inner.enabled(meta)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.inner.new_span(span)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        self.inner.record(span, values);
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.inner.record_follows_from(span, follows);
    }

    fn event(&self, event: &Event<'_>) {
        self.inner.event(event);
    }

    fn enter(&self, span: &Id) {
        self.inner.enter(span);
    }

    fn exit(&self, span: &Id) {
        self.inner.exit(span);
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.inner.clone_span(id)
    }

    fn try_close(&self, id: Id) -> bool {
        self.inner.try_close(id)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn kube_client_events_are_dropped_others_pass() {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::dispatcher::with_default(&dispatch(), || {
                tracing::error!(target: "kube_client::client::builder", "failed with error x");
                tracing::error!(target: "rustls_platform_verifier::verification", "bad cert");
                tracing::warn!(target: "steward::cli", "kept");
                tracing::debug!(target: "steward::cli", "below the level");
            });
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("kept"), "{text}");
        assert!(!text.contains("failed with error"), "{text}");
        assert!(!text.contains("bad cert"), "{text}");
        assert!(!text.contains("below the level"), "{text}");
    }
}
