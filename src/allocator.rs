//! Where the server's memory comes from, and how an unload gives it back.
//!
//! Rust's allocations go to jemalloc on Linux. A GPU host's cores bound its
//! bulk, and most of them tokenize: the tokenizer allocates and frees for
//! every token, and with glibc's malloc a third of its time went to malloc
//! and free and their arena locks. jemalloc's thread caches cut the server's
//! CPU a text by about a quarter (docs/performance.md). mimalloc was as fast
//! but kept 15-20 % more RSS after an unload, and its options cannot be set
//! before its first heap; jemalloc's purge empties every arena on demand.
//!
//! The C runtimes (ONNX Runtime, OpenVINO, ncnn) keep glibc's malloc, tuned
//! in main.rs.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation: a background thread
/// returns freed pages after `dirty_decay_ms` even while the server is idle
/// (without it, only later allocations do), and freed pages are handed back
/// at once rather than kept "muzzy".
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[export_name = "_rjem_malloc_conf"]
#[used]
static MALLOC_CONF: &[u8; JEMALLOC_OPTIONS.len()] = match JEMALLOC_OPTIONS.first_chunk() {
    Some(options) => options,
    None => unreachable!(),
};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const JEMALLOC_OPTIONS: &[u8] = b"background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0\0";

/// Hands memory freed by an unloaded engine back to the OS, so that an unload
/// shows in the process's resident size: jemalloc's arenas purged, this
/// thread's cache flushed, and glibc's free heap trimmed (the runtimes').
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallctl commands that take and return nothing (null pointers,
    // length 0), named by NUL-terminated strings; malloc_trim only walks
    // glibc's own free lists.
    unsafe {
        for command in [&b"thread.tcache.flush\0"[..], b"arena.4096.purge\0"] {
            tikv_jemalloc_sys::mallctl(command.as_ptr().cast(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0);
        }
        libc::malloc_trim(0);
    }
}
