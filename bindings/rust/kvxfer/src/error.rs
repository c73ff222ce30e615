//! `kvxfer::Error`: a kvxfer error code, its scope and the library's message.
use kvxfer_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// What recovery fits an error (`kvx_error_scope`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Not an error (code 0).
    None,
    /// This call was wrong; nothing else is affected. Fix the arguments.
    Request,
    /// One peer is unusable until removed and re-added.
    Peer,
    /// The whole transport is unusable: drop it and create a new one.
    Transport,
}

/// The kind of an error, one per `KVX_E*` code of `kvxfer.h`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// KVX_EPERM
    PermissionDenied,
    /// KVX_ENOENT: unknown peer id.
    UnknownPeer,
    /// KVX_ENOMEM
    OutOfMemory,
    /// KVX_EBUSY
    Busy,
    /// KVX_EEXIST: peer id already registered.
    PeerExists,
    /// KVX_EINVAL: invalid argument (also raised by this crate for arguments
    /// it checks itself: slice lengths, NUL bytes in strings).
    InvalidArgument,
    /// KVX_ERANGE: block index out of range.
    OutOfRange,
    /// KVX_ENOBUFS
    BufferTooSmall,
    /// KVX_ENOTSUP: backend or option not supported.
    NotSupported,
    /// KVX_EOVERFLOW: size arithmetic overflows.
    Overflow,
    /// KVX_ECONNREFUSED
    ConnectionRefused,
    /// KVX_ETIMEDOUT
    TimedOut,
    /// KVX_ECONNRESET
    ConnectionReset,
    /// KVX_EHOSTUNREACH
    HostUnreachable,
    /// KVX_ECANCELED: cancelled because the peer was removed, or added again
    /// with replace: a registration before it connected, or (since 0.9) a
    /// transfer before it ended ([`crate::TransferResult`]).
    Canceled,
    /// KVX_ECLOSED: the transport was closed.
    Closed,
    /// KVX_EBADMETA: agent metadata truncated, corrupt or forged.
    BadMetadata,
    /// KVX_EVERSION: metadata/wire major version unsupported.
    Version,
    /// KVX_EFINGERPRINT: config fingerprints differ.
    FingerprintMismatch,
    /// KVX_EGEOMETRY: block_len/base_addr/num_blocks mismatch.
    Geometry,
    /// KVX_EPEERBROKEN: the peer's connection failed earlier.
    PeerBroken,
    /// KVX_EAUTH: authentication of a connection failed.
    Auth,
    /// KVX_ECONFIG: config JSON invalid or unsupported.
    Config,
    /// KVX_EBACKEND: backend failure (device, socket).
    Backend,
    /// KVX_EINTERNAL: a bug in kvxfer.
    Internal,
    /// A code this version of the crate does not know (see [`Error::code`]).
    Other,
}

impl ErrorKind {
    /// The kind of a raw `KVX_E*` code.
    pub fn from_code(code: i32) -> ErrorKind {
        use ErrorKind::*;
        match code {
            sys::KVX_EPERM => PermissionDenied,
            sys::KVX_ENOENT => UnknownPeer,
            sys::KVX_ENOMEM => OutOfMemory,
            sys::KVX_EBUSY => Busy,
            sys::KVX_EEXIST => PeerExists,
            sys::KVX_EINVAL => InvalidArgument,
            sys::KVX_ERANGE => OutOfRange,
            sys::KVX_ENOBUFS => BufferTooSmall,
            sys::KVX_ENOTSUP => NotSupported,
            sys::KVX_EOVERFLOW => Overflow,
            sys::KVX_ECONNREFUSED => ConnectionRefused,
            sys::KVX_ETIMEDOUT => TimedOut,
            sys::KVX_ECONNRESET => ConnectionReset,
            sys::KVX_EHOSTUNREACH => HostUnreachable,
            sys::KVX_ECANCELED => Canceled,
            sys::KVX_ECLOSED => Closed,
            sys::KVX_EBADMETA => BadMetadata,
            sys::KVX_EVERSION => Version,
            sys::KVX_EFINGERPRINT => FingerprintMismatch,
            sys::KVX_EGEOMETRY => Geometry,
            sys::KVX_EPEERBROKEN => PeerBroken,
            sys::KVX_EAUTH => Auth,
            sys::KVX_ECONFIG => Config,
            sys::KVX_EBACKEND => Backend,
            sys::KVX_EINTERNAL => Internal,
            _ => Other,
        }
    }
}

/// A failed kvxfer call: the negative `KVX_E*` code and the message the
/// library gave for it (`kvx_last_error_message()`, read on the failing
/// thread right after the call).
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    code: i32,
    message: String,
}

impl Error {
    /// Error for a failed C call: copies the calling thread's last error
    /// message. Must run right after the failing call, on the same thread,
    /// before any other kvxfer call.
    pub(crate) fn from_last(code: i32) -> Error {
        // SAFETY: kvx_last_error_message never returns NULL; the string is
        // valid until this thread's next kvxfer call, and is copied at once.
        let message = unsafe {
            let p = sys::kvx_last_error_message();
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Error { code, message }
    }

    /// Error raised by this crate before calling the library.
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// The raw negative `KVX_E*` code.
    pub fn code(&self) -> i32 {
        self.code
    }

    /// The code as an [`ErrorKind`].
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::from_code(self.code)
    }

    /// What recovery fits (`kvx_error_scope_of()`).
    pub fn scope(&self) -> Scope {
        // SAFETY: pure function of an int.
        match unsafe { sys::kvx_error_scope_of(self.code) } {
            sys::KVX_SCOPE_NONE => Scope::None,
            sys::KVX_SCOPE_REQUEST => Scope::Request,
            sys::KVX_SCOPE_PEER => Scope::Peer,
            _ => Scope::Transport,
        }
    }

    /// The library's message naming the bad value, e.g.
    /// `peer 'p1': remote index 70000 >= 65536 blocks`; may be empty.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The library's short description of the code (`kvx_strerror()`).
    pub fn description(&self) -> &'static str {
        strerror(self.code)
    }
}

/// `kvx_strerror()`: a short static English description of any code.
pub fn strerror(code: i32) -> &'static str {
    // SAFETY: kvx_strerror returns static storage, never NULL.
    unsafe {
        let p = sys::kvx_strerror(code);
        if p.is_null() {
            return "unknown error";
        }
        CStr::from_ptr(p).to_str().unwrap_or("unknown error")
    }
}

/// `Ok(())` for 0, else the error with the thread's last message.
pub(crate) fn check(rc: std::os::raw::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::from_last(rc))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "kvxfer: {} ({})", self.description(), self.code)
        } else {
            write!(
                f,
                "kvxfer: {}: {} ({})",
                self.description(),
                self.message,
                self.code
            )
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("code", &self.code)
            .field("kind", &self.kind())
            .field("scope", &self.scope())
            .field("message", &self.message)
            .finish()
    }
}

impl std::error::Error for Error {}
