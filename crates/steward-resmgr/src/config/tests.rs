//! Tests of the configuration file: parsing, validation and reload.

use super::*;

#[test]
fn parses_a_full_file() {
    let text = r#"
policy:
  active: topology-aware
  config:
    reserved_cpus: "0"
    reserved_namespaces: [kube-system]
cri:
  disable_quota_for_exclusive: true
blockio:
  classes:
    slow:
      weight: 100
      devices:
        - { device: "254:0", read_bps: 1048576 }
rdt:
  classes:
    gold: { schemata: ["L3:0=ff"] }
"#;
    let cfg = FileConfig::parse(text, Path::new("c.yaml")).unwrap();
    assert_eq!(cfg.policy.active, PolicyKind::TopologyAware);
    assert_eq!(cfg.policy.config.reserved_cpus.to_string(), "0");
    assert!(cfg.cri.disable_quota_for_exclusive);
    assert_eq!(
        cfg.blockio.classes["slow"].devices[0].read_bps,
        Some(1 << 20)
    );
    assert_eq!(cfg.rdt.classes["gold"].schemata, vec!["L3:0=ff".to_owned()]);
    assert_eq!(
        FileConfig::parse("{}", Path::new("e")).unwrap(),
        FileConfig::default()
    );
    assert_eq!(
        FileConfig::parse_initial(" \n", Path::new("e")).unwrap(),
        FileConfig::default()
    );
}

#[test]
fn rejects_bad_files_with_the_reason() {
    for (text, needle) in [
        ("policy: { active: fastest }", "unknown variant"),
        ("polcy: {}", "unknown field"),
        (
            "policy: { config: { reserved_cpus: \"0-\" } }",
            "invalid cpuset",
        ),
        ("blockio: { classes: { x: { weight: 5000 } } }", "weight"),
        ("rdt: { classes: { info: {} } }", "resctrl"),
        ("cri: { exclusive_oom_score_adj: 9999 }", "oom"),
        ("", "empty"),
        ("  \n\n", "empty"),
    ] {
        let e = FileConfig::parse(text, Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

fn watcher(
    path: &Path,
    applied: &str,
    every: Duration,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::Receiver<FileConfig>,
    Metrics,
) {
    let (tx, rx) = mpsc::channel(16);
    let metrics = Metrics::default();
    let task = tokio::spawn(watch(
        path.to_path_buf(),
        Some(applied.into()),
        every,
        tx,
        metrics.clone(),
    ));
    (task, rx, metrics)
}

const RESERVED: &str = "policy:\n  active: static\n  config:\n    reserved_cpus: \"0\"\n";
/// The first half of [`RESERVED`]: valid on its own, without the
/// reservation.
const TORN: &str = "policy:\n  active: static\n";

#[tokio::test]
async fn an_empty_or_broken_read_never_replaces_the_running_configuration() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("c.yaml");
    std::fs::write(&path, RESERVED).unwrap();
    let (task, mut rx, metrics) = watcher(&path, RESERVED, Duration::from_millis(20));
    // Truncated (an editor between truncate and write), then half a line.
    std::fs::write(&path, "").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&path, "policy: { active: static, config: { reserved_c").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rx.try_recv().is_err(),
        "an empty or torn file must not be sent"
    );
    // Each refused text is counted (and logged) once, not on every poll.
    assert_eq!(metrics.event_count("config-rejected"), 2);
    // The same complete text again: nothing changed, nothing is sent.
    std::fs::write(&path, RESERVED).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = rx.try_recv();
    assert!(
        got.is_err(),
        "an unchanged configuration is not re-sent: {got:?}"
    );
    // A complete new document is applied.
    std::fs::write(
        &path,
        "policy: { active: static, config: { reserved_cpus: \"1\" } }",
    )
    .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.policy.config.reserved_cpus.to_string(), "1");
    assert_eq!(metrics.event_count("config-reload"), 1);
    task.abort();
}

#[tokio::test]
async fn a_file_read_mid_write_is_only_taken_once_it_settles() {
    use std::io::Write as _;
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("c.yaml");
    std::fs::write(&path, "{}").unwrap();
    // Polled far more often than the writer pauses, so unsettled reads
    // of the truncated and the half-written file certainly happen.
    let (task, mut rx, metrics) = watcher(&path, "{}", Duration::from_millis(5));
    for round in 0..5 {
        let doc = if round % 2 == 0 {
            RESERVED.to_owned()
        } else {
            format!("{RESERVED}# {round}\n")
        };
        let mut f = std::fs::File::create(&path).unwrap(); // truncates
        tokio::time::sleep(Duration::from_millis(3)).await;
        f.write_all(TORN.as_bytes()).unwrap();
        f.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
        f.write_all(&doc.as_bytes()[TORN.len()..]).unwrap();
        drop(f);
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            got.policy.config.reserved_cpus.to_string(),
            "0",
            "round {round}: a half-written file was taken"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            rx.try_recv().is_err(),
            "round {round}: one write, one configuration"
        );
    }
    assert_eq!(metrics.event_count("config-reload"), 5);
    assert_eq!(metrics.event_count("config-rejected"), 0);
    task.abort();
}

#[tokio::test]
async fn watcher_sends_changes_and_skips_invalid_files() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("c.yaml");
    std::fs::write(&path, "policy: { active: static }").unwrap();
    let (tx, mut rx) = mpsc::channel(4);
    let task = tokio::spawn(watch(
        path.clone(),
        Some("policy: { active: static }".into()),
        Duration::from_millis(20),
        tx,
        Metrics::default(),
    ));
    std::fs::write(&path, "policy: { active: bogus }").unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(rx.try_recv().is_err(), "an invalid file must not be sent");
    std::fs::write(&path, "policy: { active: balloons }").unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.policy.active, PolicyKind::Balloons);
    task.abort();
}
