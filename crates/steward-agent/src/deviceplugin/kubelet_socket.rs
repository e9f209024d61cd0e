//! kubelet's registration socket (`kubelet.sock` in the plugin directory),
//! watched once for every plugin of the node.
//!
//! While kubelet is away there is no use dialling it: a plugin whose own
//! `stat` finds no socket waits on this watch instead of retrying, and one
//! task looks every `poll`, so a node with a thousand Instances makes one
//! `stat` per poll instead of a thousand dials. Whether kubelet restarted is
//! still decided by each plugin's own fresh `stat` (this watch may be one
//! poll behind, and a restart counted twice would take a plugin away from
//! kubelet for a moment).

use std::path::PathBuf;
use std::time::Duration;

use steward_nodeio::FileIdentity;
use tokio::sync::watch;

/// What plugins read: the socket's identity, `None` while it is absent.
pub(crate) type KubeletSocket = watch::Receiver<Option<FileIdentity>>;

/// The receiver plugins read, and the task that keeps it current (ends
/// when every receiver is gone).
pub(crate) fn follow(
    path: PathBuf,
    poll: Duration,
) -> (KubeletSocket, impl Future<Output = ()> + Send + 'static) {
    let (tx, rx) = watch::channel(FileIdentity::of(&path));
    let task = async move {
        loop {
            tokio::select! {
                () = tx.closed() => break,
                () = tokio::time::sleep(poll) => {}
            }
            let now = FileIdentity::of(&path);
            tx.send_if_modified(|seen| {
                let changed = *seen != now;
                *seen = now;
                changed
            });
        }
    };
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn appearing_and_re_created_sockets_are_published() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        let (mut rx, task) = follow(path.clone(), Duration::from_millis(5));
        let task = tokio::spawn(task);
        assert_eq!(*rx.borrow_and_update(), None);

        std::fs::write(&path, b"").unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap()
            .unwrap();
        let first = rx.borrow_and_update().unwrap();
        assert!(first.is_at(&path));

        std::fs::remove_file(&path).unwrap();
        // A different file at the same path (tmpfs reuses inodes at once;
        // the change time tells them apart).
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&path, b"").unwrap();
        let second = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                rx.changed().await.unwrap();
                if let Some(id) = *rx.borrow_and_update()
                    && id != first
                {
                    return id;
                }
            }
        })
        .await
        .unwrap();
        assert!(second.is_at(&path));

        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
