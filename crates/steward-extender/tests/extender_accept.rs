//! The extender's accept loop out of file descriptors: it backs off
//! instead of spinning, logs once per episode, and serves again (`/healthz`)
//! as soon as descriptors are free. Its own test binary: it lowers the
//! process's descriptor limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use steward_extender::{Extender, ExtenderConfig, server};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Counts the extender server's log events.
#[derive(Default)]
struct Counter {
    warn: AtomicUsize,
    info: AtomicUsize,
}

struct Layer(Arc<Counter>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Layer {
    fn on_event(&self, e: &tracing::Event<'_>, _: Context<'_, S>) {
        // The accept loop is steward_nodeio::bounded's, shared by every
        // HTTP listener.
        let t = e.metadata().target();
        if !t.starts_with("steward_extender")
            && !t.starts_with("steward_reservations")
            && !t.starts_with("steward_nodeio::bounded")
        {
            return;
        }
        match *e.metadata().level() {
            tracing::Level::WARN | tracing::Level::ERROR => {
                self.0.warn.fetch_add(1, Ordering::SeqCst);
            }
            tracing::Level::INFO => {
                self.0.info.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

fn cpu_time() -> Duration {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the call to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// `GET /healthz` with a blocking client; `None` if it fails.
fn healthz(addr: SocketAddr, timeout: Duration) -> Option<String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_accept_loop_backs_off_and_logs_once() {
    let counter = Arc::new(Counter::default());
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Layer(counter.clone())),
    )
    .unwrap();
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let ext = Arc::new(Extender::new(
        client,
        ExtenderConfig {
            shared_watch: false,
            ..ExtenderConfig::default()
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(server::serve(listener, ext, stop.clone()));
    let open_before = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let probe = tokio::task::spawn_blocking(move || healthz(addr, Duration::from_secs(5)));
    assert!(probe.await.unwrap().unwrap().contains("200 OK"));
    // The server closes the probe's connection on its own time; were it
    // still open once the descriptors are exhausted, closing it would free
    // one mid-episode, the pending connection would be accepted (the end of
    // the episode) and the next failure would start a second one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_dir("/proc/self/fd").unwrap().count() > open_before {
        assert!(
            Instant::now() < deadline,
            "the probe's connection was never closed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Exhaust the descriptors: a low soft limit keeps that cheap.
    let mut old: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to rlimit values.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let low = libc::rlimit {
        rlim_cur: open + 32,
        rlim_max: old.rlim_max,
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let mut hold = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => hold.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // One descriptor for the client's socket: the server has none left to
    // accept it with.
    hold.pop();
    let pending = std::net::TcpStream::connect(addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter.warn.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "accept never failed");
        tokio::task::yield_now().await;
        std::thread::yield_now();
    }
    // A window of the episode: how busy and how loud is the loop?
    let window = Duration::from_millis(600);
    let (cpu0, warn0, t0) = (
        cpu_time(),
        counter.warn.load(Ordering::SeqCst),
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let (cpu, warns, took) = (
        cpu_time() - cpu0,
        counter.warn.load(Ordering::SeqCst) - warn0,
        t0.elapsed(),
    );
    eprintln!(
        "out of descriptors for {took:?}: {cpu:?} of CPU, {warns} more warnings ({} in all)",
        counter.warn.load(Ordering::SeqCst)
    );
    // Descriptors come back: the pending connection and /healthz are served.
    drop(hold);
    drop(pending);
    let probe = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(r) = healthz(addr, Duration::from_secs(2)) {
                return r;
            }
            assert!(Instant::now() < deadline, "/healthz never answered again");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert!(probe.await.unwrap().contains("200 OK"));
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) }, 0);
    stop.cancel();

    assert_eq!(warns, 0, "warned on every attempt");
    assert_eq!(
        counter.warn.load(Ordering::SeqCst),
        1,
        "one warning per episode"
    );
    assert!(cpu < took / 4, "the loop spun: {cpu:?} of CPU in {took:?}");
    // The end of the episode is told once too.
    let deadline = Instant::now() + Duration::from_secs(5);
    while counter.info.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the episode's end was not logged"
        );
        tokio::task::yield_now().await;
    }
}
