//! Large request bodies at once: the extender's memory stays bounded.
//! Its own test binary: a counting global allocator measures the peak.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use steward_extender::{Extender, ExtenderConfig, server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: forwards to the system allocator, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = NOW.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        NOW.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                let now = NOW.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                NOW.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MB: usize = 1 << 20;

/// POSTs a `size`-byte ExtenderArgs (Go's field names; a pod steward does
/// not manage, padded with JSON whitespace) streamed from a small buffer,
/// so the client holds almost nothing. The status code, 0 if the server
/// closed the connection first.
async fn big_filter(addr: SocketAddr, size: usize) -> u16 {
    let head = br#"{"Pod":{"metadata":{"name":"web","namespace":"default","uid":"u-web"},"spec":{"containers":[{"name":"main","image":"nginx","resources":{}}]},"status":{}},"Nodes":null,"NodeNames":["n1","n2"]"#;
    let tail = b"}";
    let pad = size - head.len() - tail.len();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
    );
    let (mut rd, mut wr) = s.split();
    let write = async {
        wr.write_all(req.as_bytes()).await?;
        wr.write_all(head).await?;
        let spaces = vec![b' '; 64 * 1024];
        let mut left = pad;
        while left > 0 {
            let n = left.min(spaces.len());
            wr.write_all(&spaces[..n]).await?;
            left -= n;
        }
        wr.write_all(tail).await
    };
    let read = async {
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await;
        out
    };
    let (_, out) = tokio::join!(write, read);
    let text = String::from_utf8_lossy(&out);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_large_bodies_at_once_keep_memory_bounded() {
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
    let base = NOW.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let calls: Vec<_> = (0..8)
        .map(|_| tokio::spawn(big_filter(addr, 50 * MB)))
        .collect();
    let mut codes = Vec::new();
    for c in calls {
        codes.push(
            tokio::time::timeout(Duration::from_secs(120), c)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    stop.cancel();
    let peak = PEAK.load(Ordering::SeqCst) - base;
    eprintln!(
        "8 x 50 MB bodies at once: answers {codes:?}, peak {} MB above the start",
        peak / MB
    );
    assert!(codes.iter().all(|c| *c == 200 || *c == 503), "{codes:?}");
    assert!(codes.contains(&200), "{codes:?}");
    assert!(
        peak < 160 * MB,
        "peak {} MB: memory grows with concurrent bodies",
        peak / MB
    );
}
