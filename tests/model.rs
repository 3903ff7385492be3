//! `MappedModel`: a file is mapped and its bytes equal the file's; an empty file, a pipe and a
//! `/proc` file are read instead; a missing path and a directory are errors naming the path and the
//! cause; `populate` leaves the file resident.

use std::io::Write;
use std::path::PathBuf;

use edgepool::{HugePages, MapOptions, MappedModel};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("edgepool-model-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Bytes that differ from page to page and within a page.
fn content(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

#[test]
fn a_file_is_mapped_and_its_bytes_are_the_files() {
    let d = tmp("file");
    let p = d.join("m.onnx");
    let want = content(3 * 4096 + 123);
    std::fs::write(&p, &want).unwrap();
    // SAFETY: the test's own file, unchanged while mapped.
    let m = unsafe { MappedModel::open(&p) }.unwrap();
    assert!(m.is_mapped());
    assert!(m.map_error().is_none());
    assert_eq!(&m[..], &want[..]);
    assert_eq!(m.path(), p.as_path());
    m.populate().unwrap();
    assert_ne!(*m.huge_pages(), HugePages::NotAsked, "huge pages were asked for by default");
    assert!(m.huge_page_bytes().is_some(), "the mapping is found in /proc/self/smaps");
    // The same bytes read into a buffer.
    let r = MappedModel::read(&p).unwrap();
    assert!(!r.is_mapped());
    assert_eq!(&r[..], &want[..]);
    assert_eq!(r.huge_page_bytes(), None);
    // Without hints nothing is asked for.
    let opts = MapOptions { sequential: false, will_need: false, huge_pages: false, ..MapOptions::default() };
    // SAFETY: as above.
    let n = unsafe { MappedModel::open_with(&p, &opts) }.unwrap();
    assert_eq!(*n.huge_pages(), HugePages::NotAsked);
    assert_eq!(&n[..], &want[..]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_empty_file_is_empty() {
    let d = tmp("empty");
    let p = d.join("empty.onnx");
    std::fs::write(&p, b"").unwrap();
    // SAFETY: the test's own file.
    let m = unsafe { MappedModel::open(&p) }.unwrap();
    assert!(m.is_empty());
    assert!(!m.is_mapped(), "an empty file cannot be mapped; it is read (as nothing)");
    m.populate().unwrap();
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_missing_path_and_a_directory_are_errors_naming_the_path() {
    let d = tmp("errors");
    let missing = d.join("no-such-model.onnx");
    // SAFETY: nothing is mapped.
    let e = unsafe { MappedModel::open(&missing) }.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert_eq!(e.path(), missing.as_path());
    let msg = e.to_string();
    assert!(msg.contains("no-such-model.onnx") && msg.contains("No such file"), "{msg}");
    assert_eq!(MappedModel::read(&missing).unwrap_err().kind(), std::io::ErrorKind::NotFound);

    // SAFETY: nothing is mapped.
    let e = unsafe { MappedModel::open(&d) }.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::IsADirectory);
    let msg = e.to_string();
    assert!(msg.contains(d.to_str().unwrap()) && msg.contains("Is a directory"), "{msg}");
    // It converts to an io::Error that keeps the kind and the message.
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::IsADirectory);
    assert!(io.to_string().contains("Is a directory"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_pipe_is_read_instead() {
    let d = tmp("pipe");
    let fifo = d.join("model.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let want = content(300_000);
    let w = {
        let (fifo, want) = (fifo.clone(), want.clone());
        std::thread::spawn(move || {
            std::fs::OpenOptions::new().write(true).open(&fifo).unwrap().write_all(&want).unwrap()
        })
    };
    // SAFETY: a pipe is never mapped.
    let m = unsafe { MappedModel::open(&fifo) }.unwrap();
    w.join().unwrap();
    assert!(!m.is_mapped());
    assert_eq!(m.len(), want.len());
    assert_eq!(&m[..], &want[..]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_proc_file_whose_size_reads_zero_is_read() {
    // SAFETY: a /proc file is never mapped (its size reads 0).
    let m = unsafe { MappedModel::open("/proc/self/status") }.unwrap();
    assert!(!m.is_mapped());
    assert!(m.starts_with(b"Name:"), "{:?}", String::from_utf8_lossy(&m[..40.min(m.len())]));
}

#[test]
fn populate_leaves_the_whole_file_resident() {
    let d = tmp("populate");
    let p = d.join("big.onnx");
    let want = content(4 << 20);
    {
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&want).unwrap();
        f.sync_all().unwrap();
    }
    // Evict it from the page cache (clean pages after the sync: the kernel drops them).
    let f = std::fs::File::open(&p).unwrap();
    // SAFETY: a valid descriptor.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let opts = MapOptions { sequential: false, will_need: false, huge_pages: false, ..MapOptions::default() };
    // SAFETY: the test's own file, unchanged while mapped.
    let m = unsafe { MappedModel::open_with(&p, &opts) }.unwrap();
    let resident = |m: &MappedModel| {
        let mut v = vec![0u8; m.len().div_ceil(4096)];
        // SAFETY: the mapping's start is page aligned and `v` has a byte per page.
        assert_eq!(unsafe { libc::mincore(m.as_ptr() as *mut _, m.len(), v.as_mut_ptr()) }, 0);
        v.iter().filter(|&&b| b & 1 != 0).count()
    };
    let before = resident(&m);
    m.populate().unwrap();
    let after = resident(&m);
    assert_eq!(after, m.len().div_ceil(4096), "resident pages: {before} before populate, {after} after");
    assert_eq!(&m[..], &want[..]);
    // `populate: true` does the same at open.
    let opts = MapOptions { populate: true, ..opts };
    // SAFETY: as above.
    let n = unsafe { MappedModel::open_with(&p, &opts) }.unwrap();
    assert_eq!(resident(&n), n.len().div_ceil(4096));
    let _ = std::fs::remove_dir_all(&d);
}
