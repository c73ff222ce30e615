//! The library's log messages (`kvx_set_log_handler`): a handler of the
//! application's, the level, and a flush.
use crate::error::{check, Result};
use crate::transport::static_str;
use kvxfer_sys as sys;
use std::cell::Cell;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The level of the library's messages (`kvx_log_level`), ordered from
/// `Off` to the most verbose, `Debug`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Nothing (a level to set, never a record's).
    Off,
    /// The library failed at something nobody asked for.
    Error,
    /// A peer broke, a path fell back, a peer was refused.
    Warn,
    /// Choices made: paths, addresses, codes.
    Info,
    /// Per-transfer detail.
    Debug,
}

impl LogLevel {
    /// The level of a raw `kvx_log_level` (beyond `KVX_LOG_DEBUG`: `Debug`).
    pub fn from_raw(level: c_int) -> LogLevel {
        match level {
            sys::KVX_LOG_ERROR => LogLevel::Error,
            sys::KVX_LOG_WARN => LogLevel::Warn,
            sys::KVX_LOG_INFO => LogLevel::Info,
            l if l < sys::KVX_LOG_ERROR => LogLevel::Off,
            _ => LogLevel::Debug,
        }
    }

    /// The raw `kvx_log_level`.
    pub fn raw(self) -> c_int {
        match self {
            LogLevel::Off => sys::KVX_LOG_OFF,
            LogLevel::Error => sys::KVX_LOG_ERROR,
            LogLevel::Warn => sys::KVX_LOG_WARN,
            LogLevel::Info => sys::KVX_LOG_INFO,
            LogLevel::Debug => sys::KVX_LOG_DEBUG,
        }
    }

    /// `"off"`, `"error"`, `"warn"`, `"info"` or `"debug"`.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One message of the library (`kvx_log_record`), copied for the handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// `Error` to `Debug`.
    pub level: LogLevel,
    /// One line, no newline (bytes that are not UTF-8 show as U+FFFD).
    pub message: String,
    /// The part of the library that logged it: `"core"`, `"handshake"`,
    /// `"shm"`, `"tcp"` or `"verbs"`.
    pub component: &'static str,
    /// The peer it is about, or `None` when it is not about one peer (the
    /// core's messages about a peer carry it; a backend's name it in the
    /// message).
    pub peer_id: Option<String>,
    /// When it was logged (`CLOCK_REALTIME`).
    pub time: SystemTime,
    /// Messages of the same call site the rate limit dropped since one last
    /// passed (a burst of 20, then one a second).
    pub suppressed: u64,
    /// Messages of any site dropped since the previous record because the
    /// handler fell behind (more than 4,096 waiting).
    pub dropped: u64,
    /// The kernel tid of the thread that logged it.
    pub thread_id: i32,
}

impl fmt::Display for LogRecord {
    /// As the library's stderr line, without its `kvxfer[PID] ` prefix:
    /// `warn: peer 'p1': refused: ... (3 more like this suppressed)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.level, self.message)?;
        if self.suppressed > 0 {
            write!(f, " ({} more like this suppressed)", self.suppressed)?;
        }
        if self.dropped > 0 {
            write!(
                f,
                " ({} earlier messages dropped: the log handler fell behind)",
                self.dropped
            )?;
        }
        Ok(())
    }
}

type Handler = dyn Fn(&LogRecord) + Send + Sync + 'static;

/// The handler records go to; the trampoline clones it out (never calls it
/// with the lock held).
static HANDLER: Mutex<Option<Arc<Handler>>> = Mutex::new(None);
/// Serializes the setters (but on the log thread, see `setter_lock`).
static SETTER: Mutex<()> = Mutex::new(());

thread_local! {
    /// True on the library's log thread while it runs a handler.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The setters' lock, but None inside a handler: another thread may hold
/// it while it waits in C for that very handler call to return.
fn setter_lock() -> Option<MutexGuard<'static, ()>> {
    if IN_HANDLER.with(|f| f.get()) {
        None
    } else {
        Some(lock(&SETTER))
    }
}

unsafe fn opt_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        Some(CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

unsafe extern "C" fn trampoline(r: *const sys::kvx_log_record, _user: *mut c_void) {
    let handler = lock(&HANDLER).clone();
    let (handler, r) = match (handler, r.as_ref()) {
        (Some(h), Some(r)) => (h, r),
        _ => return,
    };
    // fields a library may lack: only those below its size
    let tail = r.size as usize >= memoffset_thread_id() + std::mem::size_of::<i32>();
    let t = r.time_ns;
    let rec = LogRecord {
        level: LogLevel::from_raw(r.level),
        message: opt_str(r.message).unwrap_or_default(),
        component: static_str(r.component),
        peer_id: opt_str(r.peer_id),
        time: if t >= 0 {
            UNIX_EPOCH + Duration::from_nanos(t as u64)
        } else {
            UNIX_EPOCH - Duration::from_nanos(t.unsigned_abs())
        },
        suppressed: if tail { r.suppressed } else { 0 },
        dropped: if tail { r.dropped } else { 0 },
        thread_id: if tail { r.thread_id } else { 0 },
    };
    IN_HANDLER.with(|f| f.set(true));
    // a panic must not unwind into C: the panic hook has reported it
    let _ = catch_unwind(AssertUnwindSafe(|| handler(&rec)));
    IN_HANDLER.with(|f| f.set(false));
}

/// Offset of `kvx_log_record.thread_id` (without the memoffset crate).
fn memoffset_thread_id() -> usize {
    let r = std::mem::MaybeUninit::<sys::kvx_log_record>::uninit();
    let base = r.as_ptr();
    // SAFETY: addr_of! computes the field's address without reading it.
    let field = unsafe { std::ptr::addr_of!((*base).thread_id) };
    field as usize - base as usize
}

/// Route the library's messages to `handler`, from `level` on
/// (`kvx_set_log_handler`; it replaces `KVX_LOG`'s level). By default they
/// go to stderr, one line each (`kvxfer[PID] warn: ...`; warnings and
/// errors unless `KVX_LOG` says otherwise).
///
/// The handler is called on one thread of the library's own, one record at
/// a time, in the order they were logged, never with a library lock held:
/// it may call any kvxfer function, these included. A slow handler delays
/// only the delivery; once 4,096 records wait, the library drops (and
/// counts, [`LogRecord::dropped`]) what comes. When this returns, a call of
/// the previous handler in progress has returned and no other will start
/// (unless called from that handler itself). A panic in the handler is
/// caught (the record is lost).
pub fn set_log_handler<F>(level: LogLevel, handler: F) -> Result<()>
where
    F: Fn(&LogRecord) + Send + Sync + 'static,
{
    let _g = setter_lock();
    let h: Arc<Handler> = Arc::new(handler);
    let old = lock(&HANDLER).replace(h);
    // SAFETY: trampoline is a kvx_log_fn; it reads only the record.
    let rc =
        unsafe { sys::kvx_set_log_handler(Some(trampoline), std::ptr::null_mut(), level.raw()) };
    drop(old);
    check(rc)
}

/// Send the library's messages back to stderr, at the current level. When
/// it returns, no call of the handler is in progress and none will start
/// (so what it captured may be dropped).
pub fn clear_log_handler() -> Result<()> {
    let _g = setter_lock();
    // SAFETY: no arguments to check.
    let level = unsafe { sys::kvx_get_log_level() };
    // SAFETY: NULL: back to stderr; waits for a handler call in progress.
    check(unsafe { sys::kvx_set_log_handler(None, std::ptr::null_mut(), level) })?;
    let old = lock(&HANDLER).take();
    drop(old);
    Ok(())
}

/// Set the level of the library's messages, keeping where they go (the
/// handler of [`set_log_handler`], or stderr). Messages above it cost the
/// library one compare.
pub fn set_log_level(level: LogLevel) -> Result<()> {
    let _g = setter_lock();
    let routed = lock(&HANDLER).is_some();
    let f: sys::kvx_log_fn = if routed { Some(trampoline) } else { None };
    // SAFETY: trampoline is a kvx_log_fn (or NULL: stderr).
    check(unsafe { sys::kvx_set_log_handler(f, std::ptr::null_mut(), level.raw()) })
}

/// The library's level: as set by [`set_log_handler`] or
/// [`set_log_level`], else by the environment variable `KVX_LOG` (default
/// `Warn`).
pub fn log_level() -> LogLevel {
    // SAFETY: no arguments.
    LogLevel::from_raw(unsafe { sys::kvx_get_log_level() })
}

/// Wait until every message logged before this call has been handed to the
/// handler and that call returned (at once with stderr), for at most
/// `timeout` (`None`: no limit). Errors: `TimedOut` (some still wait),
/// `Busy` (called from the handler: it would wait for itself).
pub fn log_flush(timeout: Option<Duration>) -> Result<()> {
    let ms = match timeout {
        None => -1,
        Some(d) => d.as_millis().min(i32::MAX as u128) as c_int,
    };
    // SAFETY: plain int argument.
    check(unsafe { sys::kvx_log_flush(ms) })
}
