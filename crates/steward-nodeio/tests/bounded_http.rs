//! `steward_nodeio::bounded` over real sockets: slow, idle, oversized and
//! surplus clients are cut off or refused, and none of them keeps a
//! well-formed request from being answered. Deadlines are short here (a
//! second or less) and every assertion is on an outcome with wide margins:
//! the CI machine is busy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use steward_nodeio::bounded::{self, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const MIB: usize = 1 << 20;

fn limits() -> Limits {
    Limits {
        header_timeout: Duration::from_millis(800),
        body_timeout: Duration::from_millis(800),
        idle_timeout: Duration::from_secs(30),
        max_head: 8 << 10,
        max_body: 64 << 20,
        max_connections: 32,
        buffered: 4 << 20,
        buffered_large: 64 << 20,
    }
}

/// A server whose handler works like the extender's: it takes the whole
/// declared body's share of a 64 MiB budget before reading, answering 503
/// if it cannot within 2 s; then 200 with the body's length. `/slow`
/// answers after 1.5 s. Counts the requests it sees.
async fn server(limits: Limits) -> (SocketAddr, Arc<AtomicUsize>, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let seen = Arc::new(AtomicUsize::new(0));
    let budget = Arc::new(Semaphore::new(64 * MIB));
    let handler = {
        let seen = seen.clone();
        move |req: hyper::Request<hyper::body::Incoming>| {
            seen.fetch_add(1, Ordering::SeqCst);
            let budget = budget.clone();
            async move {
                if req.uri().path() == "/slow" {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                let declared = hyper::body::Body::size_hint(req.body())
                    .exact()
                    .unwrap_or(0);
                let share = tokio::time::timeout(
                    Duration::from_secs(2),
                    budget.acquire_many_owned(declared as u32),
                )
                .await;
                let (status, text) = match share {
                    Ok(Ok(_share)) => {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        (StatusCode::OK, format!("{} bytes\n", body.len()))
                    }
                    _ => (StatusCode::SERVICE_UNAVAILABLE, "busy\n".to_owned()),
                };
                let mut r = Response::new(Full::new(Bytes::from(text)));
                *r.status_mut() = status;
                r
            }
        }
    };
    tokio::spawn(bounded::serve(
        listener,
        limits,
        "test",
        stop.clone(),
        handler,
    ));
    (addr, seen, stop)
}

/// Sends `req` and reads until the server closes; the status (0 if none
/// came) and the whole answer.
async fn exchange(addr: SocketAddr, req: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req).await.unwrap();
    read_answer(&mut s).await
}

async fn read_answer(s: &mut TcpStream) -> (u16, String) {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_64_mib_body_that_never_comes_holds_no_budget_and_is_cut_off() {
    let (addr, seen, stop) = server(limits()).await;
    let t0 = Instant::now();
    let mut hostile = TcpStream::connect(addr).await.unwrap();
    hostile
        .write_all(
            format!(
                "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\nx",
                64 * MIB
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // While it is open, well-formed requests are answered, body read.
    for _ in 0..3 {
        let (status, text) = exchange(addr, &post("/filter", &"y".repeat(4096))).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.ends_with("4096 bytes\n"), "{text}");
    }
    // The hostile one is cut off: 408, then the end of the stream.
    let (status, text) = read_answer(&mut hostile).await;
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("did not arrive within"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // Its handler never ran: only the three well-formed requests did.
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_a_byte_at_a_time_slower_than_the_deadline_is_cut_off() {
    let (addr, seen, stop) = server(limits()).await;
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: drip\r\n\r\n";
    let mut s = TcpStream::connect(addr).await.unwrap();
    let t0 = Instant::now();
    let mut sent = 0;
    // 100 ms a byte: the whole head would take 5 s, the deadline is 0.8 s.
    for b in head {
        if s.write_all(&[*b]).await.is_err() {
            break;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Has the server answered (and closed)?
        let mut probe = [0u8; 1];
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(1), s.peek(&mut probe)).await
        {
            break;
        }
    }
    let (status, text) = read_answer(&mut s).await;
    assert_eq!(
        status,
        408,
        "after {sent} bytes in {:?}: {text}",
        t0.elapsed()
    );
    assert!(sent < head.len(), "the whole head went through");
    assert_eq!(seen.load(Ordering::SeqCst), 0, "the handler saw it");
    // A brisk client is still served.
    let (status, _) = exchange(
        addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_new_connections_wait_and_are_served_once_one_ends() {
    let (addr, _, stop) = server(Limits {
        max_connections: 4,
        ..limits()
    })
    .await;
    // Four connections, each with a request in hand (kept open by the
    // handler for 1.5 s), fill the cap...
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ... so a fifth waits: not answered while they are open.
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    fifth
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), fifth.read(&mut byte)).await;
    assert!(early.is_err(), "answered past the cap: {early:?}");
    // One goes: the fifth is served.
    drop(held.pop());
    let (status, text) = read_answer(&mut fifth).await;
    assert_eq!(status, 200, "{text}");
    drop(held);
    // And the server serves on.
    for _ in 0..8 {
        let (status, _) = exchange(
            addr,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status, 200);
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_but_a_slow_answer_is_not_cut() {
    let (addr, _, stop) = server(Limits {
        idle_timeout: Duration::from_millis(500),
        ..limits()
    })
    .await;
    // A handler slower than the idle timeout still answers on a kept-alive
    // connection...
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // ... and the connection, idle afterwards, is closed.
    let t0 = Instant::now();
    let (_, rest) = read_answer(&mut s).await;
    assert!(rest.is_empty(), "{rest}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    // A connection that never sends a byte is closed too.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (status, text) = read_answer(&mut silent).await;
    assert_eq!((status, text.as_str()), (0, ""));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_checked_from_the_head_before_any_body_is_read() {
    let (addr, seen, stop) = server(Limits {
        max_body: 1000,
        ..limits()
    })
    .await;
    // Over the body limit: 413 from the Content-Length alone.
    let (status, text) = exchange(
        addr,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n",
    )
    .await;
    assert_eq!(status, 413, "{text}");
    let (status, _) = exchange(addr, &post("/", &"z".repeat(1000))).await;
    assert_eq!(status, 200);
    // No length: 411; two lengths: 400; a head over 8 KiB: 431.
    let (status, _) = exchange(
        addr,
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(status, 411);
    let (status, _) = exchange(
        addr,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    )
    .await;
    assert_eq!(status, 400);
    let long = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "p".repeat(9000)
    );
    let (status, _) = exchange(addr, long.as_bytes()).await;
    assert_eq!(status, 431);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "a refused request reached the handler"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order() {
    let (addr, _, stop) = server(limits()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut two = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".to_vec();
    two.extend_from_slice(&post("/b", "hello"));
    s.write_all(&two).await.unwrap();
    let (_, text) = read_answer(&mut s).await;
    let a = text.find("3 bytes").unwrap_or(usize::MAX);
    let b = text.find("5 bytes").unwrap_or(usize::MAX);
    assert!(a < b && b != usize::MAX, "{text}");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_take_turns_and_the_refused_read_their_503() {
    // 8 MiB of large bodies at once: of three 6 MiB bodies sent together,
    // one is read at a time; one that waits past 2 s reads a 503 with
    // Retry-After, never a reset.
    let (addr, _, stop) = server(Limits {
        buffered_large: 8 * MIB,
        max_body: 8 * MIB as u64,
        body_timeout: Duration::from_secs(20),
        ..limits()
    })
    .await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let size = 6 * MIB;
                let head = format!(
                    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
                );
                let (mut rd, mut wr) = s.split();
                let write = async {
                    wr.write_all(head.as_bytes()).await?;
                    let chunk = vec![b' '; 64 << 10];
                    for _ in 0..size / chunk.len() {
                        wr.write_all(&chunk).await?;
                    }
                    Ok::<_, std::io::Error>(())
                };
                let read = async {
                    let mut out = Vec::new();
                    let _ = rd.read_to_end(&mut out).await;
                    String::from_utf8_lossy(&out).into_owned()
                };
                let (_, text) = tokio::join!(write, read);
                text
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in calls {
        let text = c.await.unwrap();
        let status: u16 = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        if status == 503 {
            assert!(
                text.to_ascii_lowercase().contains("retry-after: 1"),
                "{text}"
            );
        }
        statuses.push(status);
    }
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    stop.cancel();
}
