//! Where the server's memory comes from, and how an unload gives it back.
//!
//! Rust's allocations go to jemalloc on Linux. A GPU host's cores bound its
//! bulk, and most of them tokenize: the tokenizer allocates and frees for
//! every token, and with glibc's malloc about a quarter of its time went to
//! malloc and free (docs/history/performance-log.md). On a lent H100, one
//! card and call, jemalloc cut the server's CPU a text in bulk from 370 to
//! 255-290 µs and gave bulk 1.12-1.22x (docs/performance.md). mimalloc
//! saved as much but kept 15-22 % more RSS after an unload, and its options
//! cannot be set before its first heap; jemalloc's purge empties every
//! arena on demand.
//!
//! The C runtimes (ONNX Runtime, OpenVINO, ncnn) keep glibc's malloc, tuned
//! in main.rs.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation: a background thread
/// returns freed pages after `dirty_decay_ms` even while the server is idle
/// (without it, only later allocations do).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[export_name = "_rjem_malloc_conf"]
#[used]
static MALLOC_CONF: &[u8; JEMALLOC_OPTIONS.len()] = match JEMALLOC_OPTIONS.first_chunk() {
    Some(options) => options,
    None => unreachable!(),
};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const JEMALLOC_OPTIONS: &[u8] = b"background_thread:true,dirty_decay_ms:5000\0";

/// Hands memory freed by an unloaded engine back to the OS, so that an unload
/// shows in the process's resident size: jemalloc's arenas purged, this
/// thread's cache flushed, and glibc's free heap trimmed (the runtimes').
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallctl commands that take and return nothing (null pointers,
    // length 0), named by NUL-terminated strings; malloc_trim only walks
    // glibc's own free lists.
    unsafe {
        // Arena 4096 is jemalloc's MALLCTL_ARENAS_ALL: every arena.
        for command in [&b"thread.tcache.flush\0"[..], b"arena.4096.purge\0"] {
            tikv_jemalloc_sys::mallctl(command.as_ptr().cast(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0);
        }
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// jemalloc option `name` as this process runs with it.
    fn option<T: Default>(name: &str) -> T {
        let name = format!("{name}\0");
        let mut value = T::default();
        let mut size = std::mem::size_of::<T>();
        // SAFETY: reads one option of the type and size jemalloc documents for it.
        let code = unsafe { tikv_jemalloc_sys::mallctl(name.as_ptr().cast(), (&mut value as *mut T).cast(), &mut size, std::ptr::null_mut(), 0) };
        assert_eq!(code, 0, "mallctl {name}");
        value
    }

    #[test]
    fn jemalloc_runs_with_the_options_this_file_sets() {
        assert!(option::<bool>("opt.background_thread"), "the options were not read: is _rjem_malloc_conf still jemalloc's name?");
        assert_eq!(option::<isize>("opt.dirty_decay_ms"), 5000);
        super::release_freed_memory();
    }
}
