//! `Options`: the key/value settings of `kvx_transport_create()`.
use crate::error::{check, Error, Result};
use kvxfer_sys as sys;
use std::ffi::CString;
use std::ptr::NonNull;

/// Transport options, a plain Rust list of `key=value` pairs that becomes a
/// `kvx_options` object only inside [`Transport::new`](crate::Transport::new)
/// (so `Options` is `Clone`, `Send` and `Sync`, unlike the C object).
///
/// Keys and values are those of `kvx_options_set()`: every key, its values,
/// default and meaning are in the man page kvx_options_set(3)
/// (`docs/man/kvx_options_set.3` in the kvxfer sources). They are checked by
/// the library when the transport is created, or earlier with
/// [`Options::validate`].
///
/// ```no_run
/// let opts = kvxfer::Options::new()
///     .backend("tcp")
///     .set("tcp.listen", "127.0.0.1:0");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pairs: Vec<(String, String)>,
}

impl Options {
    /// No options: every key at its default.
    pub fn new() -> Options {
        Options::default()
    }

    /// Set `backend` (`"auto"`, `"tcp"`, `"verbs"`, `"shm"`).
    pub fn backend(self, backend: &str) -> Options {
        self.set("backend", backend)
    }

    /// Set `key` to `value`; setting a key again replaces its value.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Options {
        self.insert(key, value);
        self
    }

    /// In-place form of [`Options::set`].
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Options {
        let (key, value) = (key.into(), value.into());
        match self.pairs.iter_mut().find(|(k, _)| *k == key) {
            Some(pair) => pair.1 = value,
            None => self.pairs.push((key, value)),
        }
        self
    }

    /// The value set for `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The pairs in the order they were first set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Check every key and value with the library now (`kvx_options_set()`:
    /// unknown keys, malformed values) instead of at transport creation.
    pub fn validate(&self) -> Result<()> {
        self.to_raw().map(drop)
    }

    pub(crate) fn to_raw(&self) -> Result<RawOptions> {
        let mut p = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer.
        check(unsafe { sys::kvx_options_create(&mut p) })?;
        let raw = RawOptions(
            NonNull::new(p)
                .ok_or_else(|| Error::new(sys::KVX_EINTERNAL, "kvx_options_create gave NULL"))?,
        );
        for (k, v) in &self.pairs {
            let ck = cstring("option key", k)?;
            let cv = cstring("option value", v)?;
            // SAFETY: raw is live, both strings are NUL-terminated and copied.
            check(unsafe { sys::kvx_options_set(raw.0.as_ptr(), ck.as_ptr(), cv.as_ptr()) })?;
        }
        Ok(raw)
    }
}

/// An owned `kvx_options` object, destroyed on drop.
pub(crate) struct RawOptions(NonNull<sys::kvx_options>);

impl RawOptions {
    pub(crate) fn as_ptr(&self) -> *const sys::kvx_options {
        self.0.as_ptr()
    }
}

impl Drop for RawOptions {
    fn drop(&mut self) {
        // SAFETY: created by kvx_options_create, destroyed once.
        unsafe { sys::kvx_options_destroy(self.0.as_ptr()) }
    }
}

/// A C string for an argument, or an InvalidArgument error naming it.
pub(crate) fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| {
        Error::new(
            sys::KVX_EINVAL,
            format!("{} {:?} contains a NUL byte", what, s),
        )
    })
}
