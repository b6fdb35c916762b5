//! Hot reload from a Kubernetes ConfigMap volume, end to end on the real
//! binary (docs/KUBERNETES.md, "Changing the config"). The kubelet lays a
//! ConfigMap out as `budgetgate.toml → ..data/budgetgate.toml` and
//! `..data → ..<timestamp>/`, and applies a change by writing a new
//! `..<timestamp>/`, pointing a new link `..data_tmp` at it, renaming that
//! link over `..data` and deleting the old directory: the file's own name
//! is never touched. Here that sequence runs against a running gateway:
//! one reload per swap, a bad config rejected with the running policy
//! kept, 50 swaps in a row survived, and the watcher still working once
//! the old directories are gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;

/// A directory laid out as the kubelet lays out a ConfigMap volume.
struct ConfigMapVolume {
    dir: PathBuf,
    generation: u32,
}

impl ConfigMapVolume {
    /// The volume with `config` as its `budgetgate.toml`; returns it and
    /// the path the gateway is given (the user-visible link).
    fn new(dir: &Path, config: &TestConfig) -> (Self, PathBuf) {
        let mut v = ConfigMapVolume {
            dir: dir.to_path_buf(),
            generation: 0,
        };
        let first = v.write_generation(config);
        std::os::unix::fs::symlink(&first, dir.join("..data")).unwrap();
        let link = dir.join("budgetgate.toml");
        std::os::unix::fs::symlink("..data/budgetgate.toml", &link).unwrap();
        (v, link)
    }

    /// A new `..<timestamp>` directory holding `config`; its name.
    fn write_generation(&mut self, config: &TestConfig) -> String {
        self.generation += 1;
        let name = format!("..2026_01_01_00_00_00.{:09}", self.generation);
        std::fs::create_dir(self.dir.join(&name)).unwrap();
        config.write_to(&self.dir.join(&name).join("budgetgate.toml"));
        name
    }

    /// The kubelet's update: new directory, `..data_tmp` renamed over
    /// `..data`, the old directory deleted unless `keep_old`.
    fn swap(&mut self, config: &TestConfig, keep_old: bool) {
        let old = std::fs::read_link(self.dir.join("..data")).unwrap();
        let new = self.write_generation(config);
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if !keep_old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }

    /// Deletes every `..<timestamp>` directory `..data` does not point at.
    fn delete_old_generations(&self) -> usize {
        let current = std::fs::read_link(self.dir.join("..data")).unwrap();
        let mut n = 0;
        for e in std::fs::read_dir(&self.dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("..2026") && Path::new(&*name) != current {
                std::fs::remove_dir_all(e.path()).unwrap();
                n += 1;
            }
        }
        n
    }
}

fn cfg(mock: &str, tpm: u64) -> TestConfig {
    TestConfig::standard(mock, 50, limits().tpm(tpm))
}

async fn tpm_limit(gw: &GatewayProcess) -> u64 {
    let r = post_chat(gw, KEY, &hi(20)).await;
    assert_eq!(r.status(), 200);
    header_u64(&r, "x-ratelimit-limit-tokens")
}

/// Waits for reload number `n` (counting from the start) and checks that no
/// other follows within a second.
async fn exactly_reloads(gw: &GatewayProcess, n: usize) {
    gw.wait_log("policy reloaded", n).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        gw.logs_with("policy reloaded").len(),
        n,
        "{}",
        gw.dump_logs()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configmap_swap_reloads_once_keeps_the_policy_on_a_bad_config_and_survives_50_swaps() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut volume, path) = ConfigMapVolume::new(dir.path(), &cfg(&mock.base_url(), 10_000));
    let gw = GatewayProcess::start(&path, &[]).await;
    gw.wait_log("watching the config file for changes", 1).await;
    assert_eq!(tpm_limit(&gw).await, 10_000);

    // One swap, one reload, the new limit on the next request.
    volume.swap(&cfg(&mock.base_url(), 900), false);
    exactly_reloads(&gw, 1).await;
    let reloaded = gw.logs_with("policy reloaded");
    assert_eq!(
        reloaded[0].pointer("/fields/trigger"),
        Some(&serde_json::json!("file_change"))
    );
    assert_eq!(tpm_limit(&gw).await, 900);
    volume.swap(&cfg(&mock.base_url(), 800), false);
    exactly_reloads(&gw, 2).await;
    assert_eq!(tpm_limit(&gw).await, 800);

    // A bad config: rejected, the running policy stays.
    let mut bad = cfg(&mock.base_url(), 700);
    bad.tenant("t1").limits.tpm = Some(-5);
    volume.swap(&bad, false);
    gw.wait_log("config reload rejected; the running policy stays", 1)
        .await;
    assert_eq!(gw.logs_with("policy reloaded").len(), 2);
    assert_eq!(tpm_limit(&gw).await, 800);

    // 50 swaps in a row, 20 ms apart (within the debounce), their old
    // directories left for now: the last one applies.
    for i in 0..50 {
        volume.swap(&cfg(&mock.base_url(), 5_000 + i), true);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tpm_limit(&gw).await != 5_049 {
        assert!(
            std::time::Instant::now() < deadline,
            "the last of 50 swaps not applied within 10 s:\n{}",
            gw.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after_burst = gw.logs_with("policy reloaded").len();
    assert!(
        (3..=52).contains(&after_burst),
        "{after_burst} reloads for 50 swaps"
    );

    // The old directories deleted (as the kubelet does): no reload, and
    // the watcher still sees the next swap.
    assert_eq!(volume.delete_old_generations(), 50);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(gw.logs_with("policy reloaded").len(), after_burst);
    volume.swap(&cfg(&mock.base_url(), 300), false);
    exactly_reloads(&gw, after_burst + 1).await;
    assert_eq!(tpm_limit(&gw).await, 300);
    assert!(gw.logs_with("error watching the config file").is_empty());
}
