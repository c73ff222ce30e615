//! Link libkvxfer. Nothing is compiled and no bindings are generated here
//! (they are committed, see regen.sh).
//!
//! Where the library comes from, first match wins:
//!  1. KVXFER_LIB_DIR: a directory holding libkvxfer.so (an install's lib/ or
//!     a CMake build tree). KVXFER_INCLUDE_DIR optionally names the header's
//!     directory for dependents (exported as DEP_KVXFER_INCLUDE).
//!  2. `pkg-config --libs kvxfer` (binary from $PKG_CONFIG, default
//!     `pkg-config`; honours PKG_CONFIG_PATH and friends).
//!  3. A plain `-lkvxfer`, hoping the library is on the linker's default path
//!     (a warning says so).
//!
//! No rpath is added: a library outside the loader's default path must be
//! found at run time through LD_LIBRARY_PATH, ldconfig, or an rpath the final
//! binary chooses itself.
use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in [
        "KVXFER_LIB_DIR",
        "KVXFER_INCLUDE_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }

    if let Some(dir) = env::var_os("KVXFER_LIB_DIR").filter(|d| !d.is_empty()) {
        let dir = Path::new(&dir);
        if !dir.join("libkvxfer.so").exists() {
            println!(
                "cargo:warning=KVXFER_LIB_DIR={} has no libkvxfer.so",
                dir.display()
            );
        }
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=dylib=kvxfer");
        println!("cargo:lib_dir={}", dir.display());
        if let Some(inc) = env::var_os("KVXFER_INCLUDE_DIR").filter(|d| !d.is_empty()) {
            println!("cargo:include={}", Path::new(&inc).display());
        }
        return;
    }

    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    match run(&pkg_config, &["--libs", "kvxfer"]) {
        Ok(libs) => {
            let mut linked = false;
            for flag in libs.split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={}", dir);
                    println!("cargo:lib_dir={}", dir);
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib=dylib={}", lib);
                    linked |= lib == "kvxfer";
                } else {
                    println!(
                        "cargo:warning=ignoring pkg-config flag {:?} for kvxfer",
                        flag
                    );
                }
            }
            if !linked {
                println!("cargo:rustc-link-lib=dylib=kvxfer");
            }
            if let Ok(inc) = run(&pkg_config, &["--variable=includedir", "kvxfer"]) {
                println!("cargo:include={}", inc.trim());
            }
            if let Ok(dir) = run(&pkg_config, &["--variable=pcfiledir", "kvxfer"]) {
                println!("cargo:rerun-if-changed={}/kvxfer.pc", dir.trim());
            }
        }
        Err(why) => {
            println!(
                "cargo:warning=kvxfer not found by pkg-config ({}); linking -lkvxfer from the \
                 default path. Set PKG_CONFIG_PATH to the install's lib/pkgconfig or \
                 KVXFER_LIB_DIR to the directory of libkvxfer.so.",
                why
            );
            println!("cargo:rustc-link-lib=dylib=kvxfer");
        }
    }
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {}", program, e))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} failed: {}",
            program,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', " ")
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| format!("{} printed non-UTF-8", program))
}
