//! Runs the built examples: quickstart, and interop as target + initiator in
//! two processes (tests/interop/PROTOCOL.md). Plain `cargo test` builds the
//! examples next to this test's deps/ directory; when they are missing (a
//! filtered build) the test is skipped with a note, unless
//! KVXFER_REQUIRE_EXAMPLES=1 (set by bindings/rust/test.sh).
mod common;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("examples").join(name);
    if path.exists() {
        Some(path)
    } else if std::env::var("KVXFER_REQUIRE_EXAMPLES").map_or(false, |v| v == "1") {
        panic!("example {} not built at {}", name, path.display());
    } else {
        eprintln!("skipped: example {} not built at {}", name, path.display());
        None
    }
}

#[test]
fn quickstart_runs() {
    let bin = match example("quickstart") {
        Some(b) => b,
        None => return,
    };
    let out = Command::new(bin).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("done"), "{}", text);
}

#[test]
fn interop_target_and_initiator() {
    let bin = match example("interop") {
        Some(b) => b,
        None => return,
    };
    let dir = common::temp_dir("interop");
    let target = Command::new(&bin)
        .args(["target", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let init = Command::new(&bin)
        .args(["initiator", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let target = target.wait_with_output().unwrap();
    let (t_out, i_out) = (
        String::from_utf8_lossy(&target.stdout).into_owned(),
        String::from_utf8_lossy(&init.stdout).into_owned(),
    );
    assert!(init.status.success(), "initiator: {}", i_out);
    assert!(target.status.success(), "target: {}", t_out);
    let fp = kvxfer::fingerprint(r#"{"model":"interop","layers":2}"#).unwrap();
    let first = format!("fingerprint {}", fp);
    assert_eq!(t_out.lines().next(), Some(first.as_str()));
    assert_eq!(i_out.lines().next(), Some(first.as_str()));
    assert_eq!(t_out.lines().last(), Some("verified"));
    assert_eq!(i_out.lines().last(), Some("sent"));
    let json = std::fs::read_to_string(dir.join("target.json")).unwrap();
    assert!(
        json.contains("\"num_blocks\": 16") && json.contains(&fp),
        "{}",
        json
    );
    std::fs::remove_dir_all(dir).unwrap();
}
