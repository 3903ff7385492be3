//! Model files read through a memory mapping: the weights are paged in from the page cache as the
//! parser reads them, instead of being copied into a buffer as large as the file first.
//!
//! ```no_run
//! # fn main() -> Result<(), edgepool::ModelError> {
//! // SAFETY: nobody truncates or rewrites the model file while it is mapped.
//! let model = unsafe { edgepool::MappedModel::open("unet.onnx")? };
//! model.populate()?; // read it in ahead of parsing (optional)
//! let bytes: &[u8] = &model; // e.g. tract_onnx::pb::ModelProto::decode(bytes)
//! # let _ = bytes; Ok(()) }
//! ```
//!
//! Where mapping is impossible (a pipe, a `/proc` file, a file system that refuses `mmap`) the file
//! is read into a buffer allocated by edgepool instead, and [`MappedModel::is_mapped`] says so.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::global;

/// How [`MappedModel::open_with`] maps a file.
#[derive(Clone, Debug)]
pub struct MapOptions {
    /// `madvise(MADV_SEQUENTIAL)`: the kernel reads ahead aggressively and drops pages behind.
    pub sequential: bool,
    /// `madvise(MADV_WILLNEED)`: the kernel starts reading the file in at once, in the background.
    pub will_need: bool,
    /// `madvise(MADV_HUGEPAGE)`: ask for transparent huge pages (used for file mappings only where
    /// the file system and the kernel support them; [`MappedModel::huge_page_bytes`] tells).
    pub huge_pages: bool,
    /// Read the whole file in before returning (as [`MappedModel::populate`]).
    pub populate: bool,
    /// Read the file into a buffer when it cannot be mapped (else that is an error).
    pub read_fallback: bool,
}

impl Default for MapOptions {
    /// Sequential and will-need hints, huge pages asked for, no populate, read fallback on.
    fn default() -> Self {
        MapOptions { sequential: true, will_need: true, huge_pages: true, populate: false, read_fallback: true }
    }
}

/// What became of the request for huge pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Not asked for (or the file is not mapped).
    NotAsked,
    /// The kernel accepted `MADV_HUGEPAGE` for the mapping; whether it uses huge pages for a file
    /// depends on the file system ([`MappedModel::huge_page_bytes`] shows what it did).
    Advised,
    /// The kernel offers none here, and why.
    Unavailable(String),
}

/// An error opening, mapping or reading a model file: names the path, the step and the cause.
#[derive(Debug)]
pub struct ModelError {
    path: PathBuf,
    step: &'static str,
    source: io::Error,
}

impl ModelError {
    fn new(path: &Path, step: &'static str, source: io::Error) -> Self {
        ModelError { path: path.to_path_buf(), step, source }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The kind of the underlying I/O error (`NotFound`, `IsADirectory`, `OutOfMemory`, …).
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot {} model file {}: {}", self.step, self.path.display(), self.source)
    }
}

impl std::error::Error for ModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<ModelError> for io::Error {
    fn from(e: ModelError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

/// A buffer from edgepool's own entry points (whatever the program's global allocator is).
///
/// Invariants: `ptr` is null exactly when `cap == 0`; otherwise it is a live edgepool block of at
/// least `cap` bytes, owned by this buffer, and its first `len <= cap` bytes are initialised.
struct Buffer {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

impl Buffer {
    /// Grows the capacity to at least `want` bytes. `Err` (buffer intact) when memory is refused.
    fn reserve(&mut self, want: usize) -> io::Result<()> {
        if want <= self.cap {
            return Ok(());
        }
        let cap = want.max(self.cap * 2).max(64 << 10);
        let p = if self.ptr.is_null() {
            global::alloc(cap, 64)
        } else {
            // SAFETY: `ptr` is a live block of this buffer, allocated at alignment 64.
            unsafe { global::realloc(self.ptr, cap, 64) }
        };
        if p.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, format!("no memory for {cap} bytes")));
        }
        self.ptr = p;
        self.cap = cap;
        Ok(())
    }

    /// Reads `r` to its end; `hint` is the expected size.
    fn read_all(r: &mut impl Read, hint: usize) -> io::Result<Buffer> {
        let mut b = Buffer { ptr: core::ptr::null_mut(), len: 0, cap: 0 };
        if hint > 0 {
            // One more byte than expected, so that reaching the end needs no second block.
            b.reserve(hint + 1)?;
        }
        loop {
            if b.len == b.cap {
                b.reserve(b.cap + 1)?;
            }
            // SAFETY: `[ptr + len, ptr + cap)` is inside the live block (invariant); zeroed first so
            // that it is initialised before a slice is formed over it.
            let spare = unsafe {
                let spare = b.ptr.add(b.len);
                core::ptr::write_bytes(spare, 0, b.cap - b.len);
                core::slice::from_raw_parts_mut(spare, b.cap - b.len)
            };
            match r.read(spare) {
                Ok(0) => return Ok(b),
                Ok(n) => b.len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn as_slice(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: the first `len` bytes of the live block are initialised (invariant).
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: a live block owned by this buffer, or null (a no-op).
        unsafe { global::free(self.ptr) };
    }
}

enum Data {
    Mapped(memmap2::Mmap),
    Read(Buffer),
}

/// A model file, memory-mapped read-only (or read into an edgepool buffer where it cannot be
/// mapped), seen as `&[u8]`.
///
/// Invariants: the bytes are the file's as opened; a mapping is private and read-only.
pub struct MappedModel {
    path: PathBuf,
    data: Data,
    huge: HugePages,
    map_error: Option<io::Error>,
}

// SAFETY: the buffer (the one raw pointer) is owned by the model and never written after `open`;
// edgepool's blocks may be freed from any thread. A mapping is Send and Sync already.
unsafe impl Send for MappedModel {}
// SAFETY: as above: after `open` the bytes are only read.
unsafe impl Sync for MappedModel {}

impl MappedModel {
    /// Maps `path` read-only with the default [`MapOptions`] (sequential and will-need hints, huge
    /// pages asked for, read fallback).
    ///
    /// # Safety
    /// - nobody truncates or writes the file while the model lives (as for every file mapping: a
    ///   truncated file raises `SIGBUS`, a rewritten one changes the bytes under a `&[u8]`). Where
    ///   that cannot be promised, use [`MappedModel::read`].
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        // SAFETY: the caller's contract.
        unsafe { Self::open_with(path, &MapOptions::default()) }
    }

    /// Maps `path` read-only with `opts`.
    ///
    /// # Safety
    /// - as for [`MappedModel::open`].
    pub unsafe fn open_with(path: impl AsRef<Path>, opts: &MapOptions) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| ModelError::new(path, "open", e))?;
        let meta = file.metadata().map_err(|e| ModelError::new(path, "inspect", e))?;
        if meta.is_dir() {
            return Err(ModelError::new(path, "open", io::Error::from_raw_os_error(libc::EISDIR)));
        }
        // A regular file with a size is mapped; anything else (a pipe, a `/proc` file whose size
        // reads 0, an empty file) is read.
        let mut map_error = None;
        if meta.is_file() && meta.len() > 0 {
            // SAFETY: the caller promises nobody truncates or writes the file meanwhile.
            match unsafe { memmap2::MmapOptions::new().map(&file) } {
                Ok(map) => {
                    let mut m = MappedModel {
                        path: path.to_path_buf(),
                        data: Data::Mapped(map),
                        huge: HugePages::NotAsked,
                        map_error: None,
                    };
                    m.advise(opts);
                    if opts.populate {
                        m.populate()?;
                    }
                    return Ok(m);
                }
                Err(e) if opts.read_fallback => map_error = Some(e),
                Err(e) => return Err(ModelError::new(path, "map", e)),
            }
        }
        let mut m = Self::read_file(path, file, meta.len() as usize)?;
        m.map_error = map_error;
        Ok(m)
    }

    /// Reads `path` into an edgepool buffer (no mapping): safe whatever happens to the file later.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| ModelError::new(path, "open", e))?;
        let meta = file.metadata().map_err(|e| ModelError::new(path, "inspect", e))?;
        if meta.is_dir() {
            return Err(ModelError::new(path, "open", io::Error::from_raw_os_error(libc::EISDIR)));
        }
        Self::read_file(path, file, meta.len() as usize)
    }

    fn read_file(path: &Path, mut file: File, hint: usize) -> Result<Self, ModelError> {
        let buf = Buffer::read_all(&mut file, hint).map_err(|e| ModelError::new(path, "read", e))?;
        Ok(MappedModel { path: path.to_path_buf(), data: Data::Read(buf), huge: HugePages::NotAsked, map_error: None })
    }

    /// Gives the kernel the access hints `opts` asks for; hints that fail change nothing but the
    /// huge-page status.
    fn advise(&mut self, opts: &MapOptions) {
        let Data::Mapped(map) = &self.data else { return };
        if opts.sequential {
            let _ = map.advise(memmap2::Advice::Sequential);
        }
        if opts.will_need {
            let _ = map.advise(memmap2::Advice::WillNeed);
        }
        if opts.huge_pages {
            self.huge = match (thp_mode(), map.advise(memmap2::Advice::HugePage)) {
                (Some(mode), _) if mode == "never" => HugePages::Unavailable(
                    "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled: never)".into(),
                ),
                (_, Ok(())) => HugePages::Advised,
                (_, Err(e)) => HugePages::Unavailable(format!("madvise(MADV_HUGEPAGE) refused: {e}")),
            };
        }
    }

    /// Reads the whole file into the page cache now, ahead of parsing (`MADV_POPULATE_READ`, Linux
    /// 5.14+; one byte read per page where the kernel lacks it). Nothing to do for a read file.
    pub fn populate(&self) -> Result<(), ModelError> {
        let Data::Mapped(map) = &self.data else { return Ok(()) };
        match map.advise(memmap2::Advice::PopulateRead) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let mut sum = 0u8;
                for page in map.chunks(crate::os::PAGE) {
                    sum = sum.wrapping_add(std::hint::black_box(page[0]));
                }
                std::hint::black_box(sum);
                Ok(())
            }
            Err(e) => Err(ModelError::new(&self.path, "populate", e)),
        }
    }

    /// The file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            Data::Mapped(m) => m,
            Data::Read(b) => b.as_slice(),
        }
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is mapped (else it was read into a buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(self.data, Data::Mapped(_))
    }

    /// Why a regular file was read instead of mapped (the mapping's error), if it was.
    pub fn map_error(&self) -> Option<&io::Error> {
        self.map_error.as_ref()
    }

    /// What became of the request for huge pages.
    pub fn huge_pages(&self) -> &HugePages {
        &self.huge
    }

    /// Bytes of the mapping the kernel maps with huge pages now (`FilePmdMapped` in
    /// `/proc/self/smaps`): 0 where the file system gives none. `None` for a read file or when smaps
    /// cannot be read.
    pub fn huge_page_bytes(&self) -> Option<usize> {
        let Data::Mapped(map) = &self.data else { return None };
        let start = format!("{:x}-", map.as_ptr() as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        lines.next()?;
        let line = lines
            .take_while(|l| !l.split_whitespace().next().is_some_and(|w| w.contains('-')))
            .find(|l| l.starts_with("FilePmdMapped:"))?;
        line.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kb| kb * 1024)
    }
}

/// The transparent huge page mode (`always`, `madvise`, `never`), if the kernel tells.
fn thp_mode() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let sel = s.split_whitespace().find(|w| w.starts_with('['))?;
    Some(sel.trim_matches(|c| c == '[' || c == ']').to_string())
}

impl core::ops::Deref for MappedModel {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for MappedModel {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for MappedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedModel")
            .field("path", &self.path)
            .field("len", &self.as_bytes().len())
            .field("mapped", &self.is_mapped())
            .field("huge_pages", &self.huge)
            .finish()
    }
}
