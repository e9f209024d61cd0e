//! Live reload of the configuration file through a running proxy: what an
//! editor leaves on disk mid-write (an empty file, half a document) never
//! replaces the running configuration; the complete document does, once.
//! Needs no runtime: with the runtime socket absent the proxy starts from
//! its cache and the configuration path is the same.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use steward_core::cpu::CpuSet;
use steward_resmgr::{FileConfig, Proxy, ProxyConfig};

fn first_online_cpu() -> String {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let set = CpuSet::parse(online.trim()).unwrap();
    set.iter().next().unwrap().to_string()
}

async fn start(dir: &Path, config: &str) -> (Proxy, std::path::PathBuf) {
    let file = dir.join("config.yaml");
    std::fs::write(&file, config).unwrap();
    let mut cfg = ProxyConfig::new(
        dir.join("proxy.sock"),
        dir.join("no-runtime.sock"),
        dir.join("state"),
    );
    cfg.manager.config_file = Some(file.clone());
    cfg.manager.config_poll = Duration::from_millis(20);
    cfg.runtime_probe = Duration::from_secs(3600);
    cfg.manager.verify_interval = Duration::ZERO;
    cfg.runtime_timeout = Duration::from_millis(200);
    (Proxy::start(cfg).await.unwrap(), file)
}

async fn reserved(proxy: &Proxy) -> String {
    proxy
        .manager()
        .config()
        .await
        .policy
        .config
        .reserved_cpus
        .to_string()
}

async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..250 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_and_empty_reads_do_not_change_the_applied_configuration() {
    let cpu = first_online_cpu();
    let full = format!("policy:\n  active: static\n  config:\n    reserved_cpus: \"{cpu}\"\n");
    let dir = tempfile::tempdir().unwrap();
    let (proxy, file) = start(dir.path(), &full).await;
    let metrics = proxy.manager().metrics().clone();
    assert_eq!(reserved(&proxy).await, cpu);

    // An editor truncated the file and has not written yet.
    std::fs::write(&file, "").unwrap();
    eventually("the empty file refused", async || {
        metrics.event_count("config-rejected") == 1
    })
    .await;
    // Half a document that does not parse.
    std::fs::write(&file, "policy: { active: static, config: { reserved_c").unwrap();
    eventually("the half document refused", async || {
        metrics.event_count("config-rejected") == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        metrics.event_count("config-rejected"),
        2,
        "refused once each"
    );
    assert_eq!(metrics.event_count("config"), 0, "nothing was applied");
    assert_eq!(reserved(&proxy).await, cpu, "the reservation stays");

    // The editor finishes the same document: nothing to apply.
    std::fs::write(&file, &full).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metrics.event_count("config"), 0);

    // A slow writer whose first half is valid on its own (no reservation):
    // only the complete document is applied, once per write.
    for round in 1..=3u64 {
        let doc = format!("{full}# edit {round}\n");
        let torn = "policy:\n  active: static\n";
        let mut f = std::fs::File::create(&file).unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        f.write_all(torn.as_bytes()).unwrap();
        f.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        f.write_all(&doc.as_bytes()[torn.len()..]).unwrap();
        drop(f);
        eventually("the complete document applied", async || {
            metrics.event_count("config") == round
        })
        .await;
        assert_eq!(reserved(&proxy).await, cpu, "round {round}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(metrics.event_count("config"), 3, "one apply per write");
    assert_eq!(metrics.event_count("config-rejected"), 2);

    // A complete new document replaces the configuration.
    std::fs::write(
        &file,
        "policy: { active: static, config: { reserved_cpus: \"\" } }",
    )
    .unwrap();
    eventually("the new document applied", async || {
        metrics.event_count("config") == 4
    })
    .await;
    assert_eq!(reserved(&proxy).await, "");
    let running = proxy.manager().config().await;
    assert_eq!(
        running,
        FileConfig::parse("policy: { active: static }", Path::new("x")).unwrap()
    );
    proxy.shutdown().await;
}
