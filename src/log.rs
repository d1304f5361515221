//! Server log lines, written through RedisModule_Log so they land in Redis's own log.

use std::ffi::CString;
use std::ptr;

use crate::ffi::api;

fn write(level: &std::ffi::CStr, message: &str) {
    let Ok(text) = CString::new(message.replace('\0', " ")) else {
        return;
    };
    // SAFETY: a NULL context logs under the module's name; "%s" takes our one C string.
    unsafe {
        api!(RedisModule_Log)(
            ptr::null_mut(),
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
