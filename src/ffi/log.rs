//! Server log lines, written through RedisModule_Log so they land in Redis's own log, tagged
//! `<lock>` like any module's own lines.

use std::ffi::CString;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use crate::ffi::{api, Ctx};

/// A detached context kept from load to unload: logging through it names the module (`<lock>`)
/// from places that have no context of their own (callbacks, timers). NULL: log as `<module>`.
static LOG_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(ptr::null_mut());

/// At load: keep a detached context for logging.
pub fn attach(ctx: Ctx) {
    // SAFETY: ctx is the load context; the detached context lives until `detach` frees it.
    let detached = unsafe { api!(RedisModule_GetDetachedThreadSafeContext)(ctx) };
    LOG_CTX.store(detached, Ordering::Relaxed);
}

/// At unload: free the detached context.
pub fn detach() {
    let detached = LOG_CTX.swap(ptr::null_mut(), Ordering::Relaxed);
    if !detached.is_null() {
        // SAFETY: created by `attach`, freed exactly once (the swap took it).
        unsafe { api!(RedisModule_FreeThreadSafeContext)(detached) };
    }
}

fn write(level: &std::ffi::CStr, message: &str) {
    let Ok(text) = CString::new(message.replace('\0', " ")) else {
        return;
    };
    // SAFETY: the context is the detached one from `attach` (or NULL, which Redis accepts and
    // logs as `<module>`); "%s" takes our one C string.
    unsafe {
        api!(RedisModule_Log)(
            LOG_CTX.load(Ordering::Relaxed),
            level.as_ptr(),
            c"%s".as_ptr(),
            text.as_ptr(),
        );
    }
}

pub fn notice(message: &str) {
    write(c"notice", message);
}

pub fn warning(message: &str) {
    write(c"warning", message);
}
