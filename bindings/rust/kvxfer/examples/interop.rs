//! Cross-language interop example: tests/interop/PROTOCOL.md.
//!
//!     interop target DIR      wait for an initiator's blocks, verify them
//!     interop initiator DIR   send blocks to the target described in DIR
//!
//! No dependencies: the hex and the five-key JSON file are handled by hand.
use kvxfer::{Options, Transport};
use std::fs;
use std::path::Path;
use std::process::exit;
use std::time::{Duration, Instant};

const NUM_BLOCKS: u64 = 16;
const BLOCK_LEN: u64 = 4096;
const CONFIG: &str = r#"{"model":"interop","layers":2}"#;
const PEER: &str = "target";

fn pattern(block: u64) -> u8 {
    ((block * 37 + 11) & 0xff) as u8
}

fn options() -> Options {
    Options::new()
        .backend("shm,tcp")
        .set("tcp.listen", "127.0.0.1:0")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 || (args[1] != "target" && args[1] != "initiator") {
        eprintln!("usage: {} target|initiator DIR", args[0]);
        exit(2);
    }
    let dir = Path::new(&args[2]);
    let result = match kvxfer::fingerprint(CONFIG) {
        Ok(fp) => {
            println!("fingerprint {}", fp);
            if args[1] == "target" {
                target(dir)
            } else {
                initiator(dir)
            }
        }
        Err(e) => Err(e.to_string()),
    };
    if let Err(msg) = result {
        println!("error: {}", msg);
        exit(1);
    }
}

fn target(dir: &Path) -> Result<(), String> {
    let region = vec![0u8; (NUM_BLOCKS * BLOCK_LEN) as usize];
    let t = Transport::new(region, NUM_BLOCKS, BLOCK_LEN, Some(CONFIG), &options())
        .map_err(|e| e.to_string())?;
    let meta = t.agent_metadata().map_err(|e| e.to_string())?;
    let json = format!(
        "{{\"metadata\": \"{}\", \"base_addr\": {}, \"num_blocks\": {}, \"block_len\": {}, \"fingerprint\": \"{}\"}}\n",
        hex_encode(&meta),
        t.base_addr(),
        t.num_blocks(),
        t.block_len(),
        t.config_fingerprint()
    );
    let tmp = dir.join("target.json.tmp");
    fs::write(&tmp, json).map_err(|e| format!("write {}: {}", tmp.display(), e))?;
    fs::rename(&tmp, dir.join("target.json")).map_err(|e| format!("rename: {}", e))?;

    wait_for_file(&dir.join("done"), Duration::from_secs(60))?;

    // Destroying the transport ends all writes and hands the region back.
    let region = t.into_region().expect("owned region");
    let mut bad = 0;
    for (i, block) in region.chunks(BLOCK_LEN as usize).enumerate() {
        let want = pattern(i as u64);
        if let Some(off) = block.iter().position(|&b| b != want) {
            println!(
                "block {}: byte {} is {:#04x}, want {:#04x}",
                i, off, block[off], want
            );
            bad += 1;
        }
    }
    if bad > 0 {
        return Err(format!("{} of {} blocks differ", bad, NUM_BLOCKS));
    }
    println!("verified");
    Ok(())
}

fn initiator(dir: &Path) -> Result<(), String> {
    let path = dir.join("target.json");
    wait_for_file(&path, Duration::from_secs(60))?;
    let text = fs::read_to_string(&path).map_err(|e| format!("read {}: {}", path.display(), e))?;
    let info = json::parse(&text).map_err(|e| format!("{}: {}", path.display(), e))?;
    let field = |k: &str| {
        info.get(k)
            .ok_or_else(|| format!("target.json has no {:?}", k))
    };
    let metadata = hex_decode(
        field("metadata")?
            .as_str()
            .ok_or("metadata is not a string")?,
    )?;
    let num = |k: &str| -> Result<u64, String> {
        field(k)?
            .as_u64()
            .ok_or_else(|| format!("{} is not an unsigned integer", k))
    };
    let (base_addr, num_blocks, block_len) =
        (num("base_addr")?, num("num_blocks")?, num("block_len")?);
    let their_fp = field("fingerprint")?.as_str().unwrap_or("").to_string();

    let mut region = vec![0u8; (NUM_BLOCKS * BLOCK_LEN) as usize];
    for (i, block) in region.chunks_mut(BLOCK_LEN as usize).enumerate() {
        block.fill(pattern(i as u64));
    }
    let t = Transport::new(region, NUM_BLOCKS, BLOCK_LEN, Some(CONFIG), &options())
        .map_err(|e| e.to_string())?;
    if their_fp != t.config_fingerprint() {
        eprintln!(
            "note: target fingerprint {:?} differs from ours {:?}",
            their_fp,
            t.config_fingerprint()
        );
    }
    t.add_remote_peer(PEER, &metadata, base_addr, num_blocks, block_len)
        .map_err(|e| e.to_string())?;
    let (backend, path) = t.peer_backend(PEER).map_err(|e| e.to_string())?;
    println!("path {} {}", backend, path);
    let idxs: Vec<u64> = (0..NUM_BLOCKS).collect();
    let id = t
        .write_blocks(PEER, &idxs, &idxs)
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = t.poll(None).map_err(|e| e.to_string())?;
        if res.failed.contains(&id) {
            return Err(format!("transfer {} failed", id));
        }
        if res.done.contains(&id) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("transfer {} not done after 30 s", id));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    fs::write(dir.join("done"), b"").map_err(|e| format!("create done: {}", e))?;
    println!("sent");
    Ok(())
}

fn wait_for_file(path: &Path, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not appear within {:?}",
                path.display(),
                timeout
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

fn hex_decode(s: &str) -> Result<Vec<u8>, String> {
    fn nibble(c: u8) -> Result<u8, String> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(format!("bad hex digit {:?}", c as char)),
        }
    }
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return Err("odd number of hex digits".to_string());
    }
    b.chunks(2)
        .map(|p| Ok(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// Just enough JSON: the whole grammar, numbers kept as text.
mod json {
    #[allow(dead_code)] // Bool and Array contents are parsed but not used here.
    pub enum Value {
        Null,
        Bool(bool),
        Number(String),
        Str(String),
        Array(Vec<Value>),
        Object(Vec<(String, Value)>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Object(m) => m.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::Str(s) => Some(s),
                _ => None,
            }
        }
        pub fn as_u64(&self) -> Option<u64> {
            match self {
                Value::Number(n) => n.parse().ok(),
                _ => None,
            }
        }
    }

    pub fn parse(text: &str) -> Result<Value, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn err(&self, what: &str) -> String {
            format!("JSON: {} at byte {}", what, self.i)
        }
        fn ws(&mut self) {
            while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            }
        }
        fn peek(&self) -> Option<u8> {
            self.s.get(self.i).copied()
        }
        fn eat(&mut self, c: u8) -> Result<(), String> {
            self.ws();
            if self.peek() == Some(c) {
                self.i += 1;
                Ok(())
            } else {
                Err(self.err(&format!("expected {:?}", c as char)))
            }
        }
        fn literal(&mut self, word: &str, v: Value) -> Result<Value, String> {
            if self.s[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                Ok(v)
            } else {
                Err(self.err("bad literal"))
            }
        }
        fn value(&mut self) -> Result<Value, String> {
            self.ws();
            match self.peek() {
                Some(b'{') => {
                    self.i += 1;
                    let mut m = Vec::new();
                    self.ws();
                    if self.peek() == Some(b'}') {
                        self.i += 1;
                        return Ok(Value::Object(m));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.eat(b':')?;
                        m.push((k, self.value()?));
                        self.ws();
                        match self.peek() {
                            Some(b',') => self.i += 1,
                            Some(b'}') => {
                                self.i += 1;
                                return Ok(Value::Object(m));
                            }
                            _ => return Err(self.err("expected ',' or '}'")),
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut a = Vec::new();
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                        return Ok(Value::Array(a));
                    }
                    loop {
                        a.push(self.value()?);
                        self.ws();
                        match self.peek() {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                return Ok(Value::Array(a));
                            }
                            _ => return Err(self.err("expected ',' or ']'")),
                        }
                    }
                }
                Some(b'"') => Ok(Value::Str(self.string()?)),
                Some(b't') => self.literal("true", Value::Bool(true)),
                Some(b'f') => self.literal("false", Value::Bool(false)),
                Some(b'n') => self.literal("null", Value::Null),
                Some(c) if c == b'-' || c.is_ascii_digit() => {
                    let start = self.i;
                    while self.i < self.s.len()
                        && matches!(
                            self.s[self.i],
                            b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                        )
                    {
                        self.i += 1;
                    }
                    let n = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                    Ok(Value::Number(n.to_string()))
                }
                _ => Err(self.err("expected a value")),
            }
        }
        fn hex4(&mut self) -> Result<u32, String> {
            let h = self
                .s
                .get(self.i..self.i + 4)
                .ok_or_else(|| self.err("short \\u escape"))?;
            let h = std::str::from_utf8(h).map_err(|_| self.err("bad \\u escape"))?;
            let v = u32::from_str_radix(h, 16).map_err(|_| self.err("bad \\u escape"))?;
            self.i += 4;
            Ok(v)
        }
        fn string(&mut self) -> Result<String, String> {
            if self.peek() != Some(b'"') {
                return Err(self.err("expected a string"));
            }
            self.i += 1;
            let mut out = String::new();
            loop {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i] != b'"' && self.s[self.i] != b'\\' {
                    self.i += 1;
                }
                out.push_str(
                    std::str::from_utf8(&self.s[start..self.i])
                        .map_err(|_| self.err("bad UTF-8"))?,
                );
                match self.peek() {
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let c = self.peek().ok_or_else(|| self.err("unterminated escape"))?;
                        self.i += 1;
                        match c {
                            b'"' => out.push('"'),
                            b'\\' => out.push('\\'),
                            b'/' => out.push('/'),
                            b'b' => out.push('\u{8}'),
                            b'f' => out.push('\u{c}'),
                            b'n' => out.push('\n'),
                            b'r' => out.push('\r'),
                            b't' => out.push('\t'),
                            b'u' => {
                                let mut cp = self.hex4()?;
                                let save = self.i;
                                if (0xd800..0xdc00).contains(&cp)
                                    && self.s[self.i..].starts_with(b"\\u")
                                {
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if (0xdc00..0xe000).contains(&lo) {
                                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                                    } else {
                                        self.i = save; // lone high surrogate
                                    }
                                }
                                out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                            }
                            _ => return Err(self.err("bad escape")),
                        }
                    }
                    _ => return Err(self.err("unterminated string")),
                }
            }
        }
    }
}
