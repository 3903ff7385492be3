//! How `libedgepool.so` is linked, for what it costs every process that preloads it in resident
//! memory (README, "What the library costs a process"). Three steps, each skipped where it does not
//! apply, and all off with `EDGEPOOL_PLAIN_LINK=1`:
//!
//! 1. **The unwinder linked in.** Rust's standard library asks for `-lgcc_s`, so the library needs
//!    `libgcc_s.so.1`: one more shared object mapped and relocated in every process (about 100 KiB
//!    resident), for code that only runs if a panic unwinds, which the allocator never does. Where
//!    the C compiler has `libgcc_eh.a` (the same unwinder, built for static linking), a copy named
//!    `libgcc_s.a` in a directory searched first makes the linker take it instead. Its symbols stay
//!    local: a cdylib exports only its `#[no_mangle]` functions.
//! 2. **The text layout** (`link/layout.ld`): the code that every process runs (edgepool's hot code,
//!    the code that runs when the library is loaded, and the PLT) goes first in the text, in one
//!    64 KiB window, away from the standard library's panic and backtrace machinery and from
//!    edgepool's cold code. Segments are aligned to 64 KiB (`-z max-page-size`, which glibc's loader
//!    honours for the load address since 2.35) and the executable segment starts on such a boundary
//!    (`-z separate-code`), so that the kernel's 64 KiB fault-around windows fall where the layout
//!    expects them. The read-only data that no process reads unless a panic unwinds (the standard
//!    library's, the exception and unwind tables) goes after the text, in a segment of its own, so
//!    that the first segment holds only the loader's tables and edgepool's own read-only data. See
//!    that file.
//! 3. **Packed relative relocations** (`-z pack-relative-relocs`, `DT_RELR`): the library's 700-odd
//!    relative relocations (vtables, panic locations) as a bitmap of about 240 bytes instead of 17 KiB
//!    of `.rela.dyn`, which the loader reads in every process. Only where the build host's glibc (the
//!    one the library is built for: native builds only) is 2.36 or later, which reads them; an older
//!    glibc would refuse to load the library (it needs the version `GLIBC_ABI_DT_RELR`).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link/layout.ld");
    println!("cargo:rerun-if-env-changed=EDGEPOOL_PLAIN_LINK");
    println!("cargo:rerun-if-env-changed=CC");
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let target_env = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os != "linux" || target_env != "gnu" || env::var("EDGEPOOL_PLAIN_LINK").is_ok_and(|v| v == "1") {
        return;
    }
    static_unwinder();
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let script = dir.join("link").join("layout.ld");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", script.display());
    for arg in ["-Wl,-z,max-page-size=0x10000", "-Wl,-z,separate-code"] {
        println!("cargo:rustc-cdylib-link-arg={arg}");
    }
    if env::var("TARGET").ok() == env::var("HOST").ok() && host_glibc().is_some_and(|v| v >= (2, 36)) {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,pack-relative-relocs");
    }
}

/// Step 3: the version of the glibc this build script runs on (major, minor), on a glibc host.
fn host_glibc() -> Option<(u32, u32)> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn gnu_get_libc_version() -> *const std::ffi::c_char;
        }
        // SAFETY: glibc returns a pointer to a static NUL-terminated string such as "2.36".
        let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) }.to_str().ok()?;
        let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
        Some((parts.next()??, parts.next()??))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Step 1: `libgcc_s.a` (a copy of the C compiler's `libgcc_eh.a`) in `OUT_DIR`, searched first.
/// Native builds only: a cross build's `cc` would offer the host's archive.
fn static_unwinder() {
    if env::var("TARGET").ok() != env::var("HOST").ok() {
        return;
    }
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let Ok(out) = Command::new(&cc).arg("-print-file-name=libgcc_eh.a").output() else {
        println!("cargo:warning=edgepool: `{cc}` not found; libedgepool.so will need libgcc_s.so.1");
        return;
    };
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // Without the file the compiler prints the bare name back.
    if !out.status.success() || !path.is_absolute() || !path.is_file() {
        println!("cargo:warning=edgepool: no libgcc_eh.a from `{cc}`; libedgepool.so will need libgcc_s.so.1");
        return;
    }
    let dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("static-unwind");
    if std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(&path, dir.join("libgcc_s.a"))).is_err() {
        println!("cargo:warning=edgepool: could not copy {}; libedgepool.so will need libgcc_s.so.1", path.display());
        return;
    }
    println!("cargo:rerun-if-changed={}", path.display());
    println!("cargo:rustc-link-search=native={}", dir.display());
}
