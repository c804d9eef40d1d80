//! contrib/systemd/: the agent's service and the per-profile oneshot service and timer pass
//! `systemd-analyze verify` (with ExecStart pointing at the binary under test, which verify
//! requires to exist).

use std::fs;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn units_pass_systemd_analyze_verify() {
    let contrib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let tmp = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for name in ["cairn-agent.service", "cairn-backup@.service", "cairn-backup@.timer"] {
        let text = fs::read_to_string(contrib.join(name)).unwrap();
        assert!(text.contains("/usr/local/bin/cairn") || name.ends_with(".timer"), "{name}");
        let text = text.replace("/usr/local/bin/cairn", env!("CARGO_BIN_EXE_cairn"));
        fs::write(tmp.path().join(name), text).unwrap();
    }
    // A template is verified as an instance of it.
    for (instance, template) in
        [("cairn-backup@laptop.service", "cairn-backup@.service"), ("cairn-backup@laptop.timer", "cairn-backup@.timer")]
    {
        std::os::unix::fs::symlink(tmp.path().join(template), tmp.path().join(instance)).unwrap();
        units.push(tmp.path().join(instance));
    }
    units.push(tmp.path().join("cairn-agent.service"));
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .expect("systemd-analyze (Debian's systemd; .ci/run installs it)");
    let err = String::from_utf8_lossy(&out.stderr);
    // Lines about units outside contrib (the host's own) are not ours to judge.
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("cairn")).collect();
    assert!(out.status.success() && ours.is_empty(), "status {}\n{err}", out.status);
}
