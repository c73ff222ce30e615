//! Quickstart: two transports in one process, one writes blocks into the
//! other over the tcp backend on 127.0.0.1.
//!
//!     cargo run --example quickstart
//!
//! (with libkvxfer found through PKG_CONFIG_PATH or KVXFER_LIB_DIR at build
//! time and LD_LIBRARY_PATH at run time when it is not installed system-wide)
use kvxfer::{Options, Transport};
use std::time::{Duration, Instant};

const NUM_BLOCKS: u64 = 8;
const BLOCK_LEN: u64 = 4096;
const CONFIG: &str = r#"{"model":"quickstart","layers":4,"dtype":"bfloat16"}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "kvxfer {} ({})",
        kvxfer::version(),
        kvxfer::fingerprint(CONFIG)?
    );
    let opts = Options::new()
        .backend("tcp")
        .set("tcp.listen", "127.0.0.1:0");

    // The sender's region: block i filled with byte i + 1. The receiver's: zeros.
    let mut src = vec![0u8; (NUM_BLOCKS * BLOCK_LEN) as usize];
    for (i, block) in src.chunks_mut(BLOCK_LEN as usize).enumerate() {
        block.fill(i as u8 + 1);
    }
    let sender = Transport::new(src, NUM_BLOCKS, BLOCK_LEN, Some(CONFIG), &opts)?;
    let receiver = Transport::new(
        vec![0u8; (NUM_BLOCKS * BLOCK_LEN) as usize],
        NUM_BLOCKS,
        BLOCK_LEN,
        Some(CONFIG),
        &opts,
    )?;
    println!("sender {:?}", sender);

    // Control plane (here: a function call) hands the receiver's metadata over.
    sender.add_remote_peer(
        "receiver",
        &receiver.agent_metadata()?,
        receiver.base_addr(),
        receiver.num_blocks(),
        receiver.block_len(),
    )?;

    // Local blocks 0,1,2 -> remote blocks 5,6,7 (one run), then wait.
    let id = sender.write_blocks("receiver", &[0, 1, 2], &[5, 6, 7])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = sender.poll(None)?;
        if res.failed.contains(&id) {
            return Err(format!("transfer {} failed", id).into());
        }
        if res.done.contains(&id) {
            break;
        }
        if Instant::now() > deadline {
            return Err("transfer timed out".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }

    // Destroying the receiver gives its region back, with the bytes that landed.
    let region = receiver.into_region().expect("owned region");
    for (i, block) in region.chunks(BLOCK_LEN as usize).enumerate() {
        let want = match i {
            5..=7 => i as u8 - 4,
            _ => 0,
        };
        if block.iter().any(|&b| b != want) {
            return Err(format!("block {} is wrong", i).into());
        }
    }
    println!(
        "transfer {} done: remote blocks 5..7 hold local blocks 0..2",
        id
    );
    Ok(())
}
