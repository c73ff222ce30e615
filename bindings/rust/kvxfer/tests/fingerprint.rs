//! Config fingerprints equal Python's
//! sha256(json.dumps(d, sort_keys=True, separators=(",", ":")))[:16].
use std::process::Command;

/// (config JSON text, fingerprint computed with /usr/bin/python3)
const CASES: &[(&str, &str)] = &[
    (r#"{"model":"interop","layers":2}"#, "cba5ae8625a9ca0f"),
    (r#"{"layers":2,"model":"interop"}"#, "cba5ae8625a9ca0f"),
    (
        r#"{"model": "llama-3-8b", "num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "block_size": 16}"#,
        "94ff26509afe837f",
    ),
    (
        r#"{"a":{"z":1,"b":[1,2.5,null,true,false]},"\u00e9t\u00e9":"caf\u00e9 \ud83d\ude00","x":-0.0}"#,
        "d5674cf573900681",
    ),
    (
        r#"{"f":1e100,"g":0.1,"h":1.0,"i":123456789012345678901234567890}"#,
        "05d535359f52f307",
    ),
    (
        r#"{"s":"tab\tquote\"back\\slash\u0001ctl"}"#,
        "d20cd89e9d94d892",
    ),
    (
        r#"{"nested":{"deep":{"deeper":[[],[{}],{"k":"v"}]}}}"#,
        "594f4db3f83c2c57",
    ),
    ("{}", ""),
    ("null", ""),
    ("  { }  ", ""),
];

#[test]
fn known_python_values() {
    for (json, want) in CASES {
        assert_eq!(kvxfer::fingerprint(json).unwrap(), *want, "config {}", json);
    }
}

#[test]
fn transport_fingerprint_matches_free_function() {
    for (json, want) in CASES.iter().take(4) {
        let t = kvxfer::Transport::new(
            vec![0; 16],
            1,
            16,
            Some(json),
            &kvxfer::Options::new()
                .backend("tcp")
                .set("tcp.listen", "127.0.0.1:0"),
        )
        .unwrap();
        assert_eq!(t.config_fingerprint(), *want);
    }
}

#[test]
fn invalid_configs() {
    for bad in [
        "",
        "[]",
        "1",
        "\"s\"",
        "{",
        "{\"a\":}",
        "{\"a\":1}x",
        "{'a':1}",
    ] {
        let e = kvxfer::fingerprint(bad).unwrap_err();
        assert_eq!(e.kind(), kvxfer::ErrorKind::Config, "{:?} -> {:?}", bad, e);
        assert!(!e.message().is_empty());
    }
}

/// The same comparison against a live python3, including raw UTF-8 input,
/// when /usr/bin/python3 exists (skipped with a note otherwise).
#[test]
fn live_python_agrees() {
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        eprintln!("skipped: {} not found", python);
        return;
    }
    let mut configs: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    configs.extend([
        "{\"caf\u{e9}\":\"\u{1f600} \u{4e2d}\u{6587}\",\"n\":[1,-2,3.25e-7,1E+5]}",
        r#"{"big":18446744073709551616,"neg":-9223372036854775809,"dup":1,"dup":2}"#,
        r#"{"b":true,"a":null,"c":{"y":[],"x":{}}}"#,
    ]);
    let script = r#"
import sys, json, hashlib
for line in sys.stdin.read().split("\n\x00\n"):
    d = json.loads(line)
    if not d:
        print("")
    else:
        print(hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16])
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(configs.join("\n\0\n").as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let py: Vec<&str> = text.split('\n').take(configs.len()).collect();
    assert_eq!(py.len(), configs.len());
    for (json, want) in configs.iter().zip(py) {
        assert_eq!(kvxfer::fingerprint(json).unwrap(), want, "config {}", json);
    }
}
