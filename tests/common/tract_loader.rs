//! The tract loader shared by `examples/tract_load.rs`, `examples/demo.rs` and `tests/tract_phase.rs`:
//! a switch allocator (chosen once from `EDGEPOOL_ALLOCATOR`: edgepool, glibc's malloc, the
//! `mimalloc` and `tikv-jemallocator` crates, or glibc with a live-bytes count for the floor), and
//! the measured load of a model through `edgepool::MappedModel` (or read into a buffer).
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Instant;

use prost::Message;
use tract_onnx::prelude::*;

#[path = "unet.rs"]
mod unet;
pub use unet::{generate, rng};

static EDGEPOOL: edgepool::EdgePool = edgepool::EdgePool::new();
static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
static CHOICE: AtomicU8 = AtomicU8::new(0);
/// Live bytes and their peak under `EDGEPOOL_ALLOCATOR=count` (glibc, counted).
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Choice {
    Edgepool = 1,
    System = 2,
    Mimalloc = 3,
    Jemalloc = 4,
    Count = 5,
}

/// The allocator of this run, decided once at the first allocation from `EDGEPOOL_ALLOCATOR`
/// (`system`, `mimalloc`, `jemalloc`, `count`; anything else or unset: edgepool), scanning the
/// environment without allocating.
#[inline]
pub fn choice() -> Choice {
    let mut c = CHOICE.load(Ordering::Relaxed);
    if c == 0 {
        c = Choice::Edgepool as u8;
        edgepool::os::for_each_option(|name, value| {
            if name == b"ALLOCATOR" {
                c = match value {
                    b"system" => Choice::System,
                    b"mimalloc" => Choice::Mimalloc,
                    b"jemalloc" => Choice::Jemalloc,
                    b"count" => Choice::Count,
                    _ => Choice::Edgepool,
                } as u8;
            }
        });
        CHOICE.store(c, Ordering::Relaxed);
    }
    match c {
        2 => Choice::System,
        3 => Choice::Mimalloc,
        4 => Choice::Jemalloc,
        5 => Choice::Count,
        _ => Choice::Edgepool,
    }
}

/// Whether this run is on glibc's malloc (counted or not).
pub fn use_system() -> bool {
    matches!(choice(), Choice::System | Choice::Count)
}

/// Counts `add` bytes allocated and `sub` freed.
fn count(add: usize, sub: usize) {
    if add >= sub {
        let now = LIVE.fetch_add(add - sub, Ordering::Relaxed) + (add - sub);
        PEAK.fetch_max(now, Ordering::Relaxed);
    } else {
        LIVE.fetch_sub(sub - add, Ordering::Relaxed);
    }
}

/// Every call goes to one allocator, the same for the whole run.
pub struct Switch;

// SAFETY: forwards every call to one allocator, the same for the whole run.
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe {
            match choice() {
                Choice::Edgepool => EDGEPOOL.alloc(l),
                Choice::System => System.alloc(l),
                Choice::Mimalloc => MIMALLOC.alloc(l),
                Choice::Jemalloc => JEMALLOC.alloc(l),
                Choice::Count => {
                    let p = System.alloc(l);
                    if !p.is_null() {
                        count(l.size(), 0);
                    }
                    p
                }
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded to the allocator that made `p`.
        unsafe {
            match choice() {
                Choice::Edgepool => EDGEPOOL.dealloc(p, l),
                Choice::System => System.dealloc(p, l),
                Choice::Mimalloc => MIMALLOC.dealloc(p, l),
                Choice::Jemalloc => JEMALLOC.dealloc(p, l),
                Choice::Count => {
                    count(0, l.size());
                    System.dealloc(p, l)
                }
            }
        }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe {
            match choice() {
                Choice::Edgepool => EDGEPOOL.alloc_zeroed(l),
                Choice::System => System.alloc_zeroed(l),
                Choice::Mimalloc => MIMALLOC.alloc_zeroed(l),
                Choice::Jemalloc => JEMALLOC.alloc_zeroed(l),
                Choice::Count => {
                    let p = System.alloc_zeroed(l);
                    if !p.is_null() {
                        count(l.size(), 0);
                    }
                    p
                }
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded to the allocator that made `p`.
        unsafe {
            match choice() {
                Choice::Edgepool => EDGEPOOL.realloc(p, l, n),
                Choice::System => System.realloc(p, l, n),
                Choice::Mimalloc => MIMALLOC.realloc(p, l, n),
                Choice::Jemalloc => JEMALLOC.realloc(p, l, n),
                Choice::Count => {
                    let q = System.realloc(p, l, n);
                    if !q.is_null() {
                        count(n, l.size());
                    }
                    q
                }
            }
        }
    }
}

fn status_kb(key: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).unwrap().parse().unwrap()
}

fn minor_faults() -> i64 {
    // SAFETY: getrusage writes the struct.
    unsafe {
        let mut u: libc::rusage = core::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u.ru_minflt
    }
}

/// Loads the model, runs one inference, and prints one line of `key=value` figures.
pub fn load(path: &str, phase: bool) -> TractResult<()> {
    load_with(path, &Load { mode: phase.then_some(edgepool::PhaseMode::Segregated), ..Load::default() })
}

/// The live heap's bytes and peak: from `scripts/live-heap.c` when that tracer is preloaded, or
/// from this run's own count under `EDGEPOOL_ALLOCATOR=count` (`None` otherwise).
fn live_heap(name: &std::ffi::CStr) -> Option<usize> {
    if choice() == Choice::Count {
        return Some(if name == c"live_heap_peak" {
            PEAK.load(Ordering::Relaxed)
        } else {
            LIVE.load(Ordering::Relaxed)
        });
    }
    // SAFETY: dlsym with a NUL-terminated name; a symbol it finds is the tracer's `size_t f(void)`.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
        (!f.is_null()).then(|| core::mem::transmute::<*mut libc::c_void, extern "C" fn() -> usize>(f)())
    }
}

/// The mapping's huge-page status and bytes mapped with huge pages (`huge_pages=advised/0`).
static HUGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// How one load is done.
#[derive(Clone, Debug, Default)]
pub struct Load {
    /// The load phase around loading, in this mode (or none).
    pub mode: Option<edgepool::PhaseMode>,
    /// Read the file into a buffer (`std::fs::read`) instead of mapping it with `MappedModel`.
    pub read: bool,
    /// `MappedModel::populate` before parsing.
    pub populate: bool,
    /// `edgepool::prefault_free(bytes)` after loading, before the first inference.
    pub prefault_free: usize,
    /// Milliseconds to stay alive after the inference with the model still loaded (memory curves
    /// then show the run phase after the step down).
    pub hold_ms: u64,
    /// Threads loading the model at once (0 or 1: the calling thread alone). With several, the load
    /// phase is process-wide (`load_phase_process_with`) and every thread's model runs once.
    pub threads: usize,
}

/// Builds the runnable model from its protobuf, which is dropped as soon as tract has translated
/// it (its copy of the weights is not kept alive through the optimisation), as tract's own
/// `model_for_path` does.
fn build(proto: tract_onnx::pb::ModelProto) -> TractResult<std::sync::Arc<TypedRunnableModel>> {
    let model = tract_onnx::onnx().model_for_proto_model(&proto)?;
    drop(proto);
    model.with_input_fact(0, f32::fact([1, 3, 32, 32]).into())?.into_optimized()?.into_runnable()
}

/// Decodes the model's protobuf from the file as `how` says, and drops the file's bytes (the
/// mapping or the buffer) before the model is built: the protobuf holds its own copy of the weights.
/// Decoding straight from the slice is what tract's own `model_for_path` does over its mapping;
/// `model_for_read` on a cursor would first copy the whole file into a `Vec`.
fn decode(path: &str, how: &Load) -> TractResult<tract_onnx::pb::ModelProto> {
    if how.read {
        return Ok(tract_onnx::pb::ModelProto::decode(&std::fs::read(path)?[..])?);
    }
    // SAFETY: nobody writes or truncates the model file while it is loaded.
    let file = unsafe { edgepool::MappedModel::open(path)? };
    if how.populate {
        file.populate()?;
    }
    let proto = tract_onnx::pb::ModelProto::decode(&file[..])?;
    // What the kernel did with the huge-page hint, once the whole file has been read.
    let _ = HUGE.set(format!(
        "{}/{}",
        match file.huge_pages() {
            edgepool::HugePages::Advised => "advised",
            edgepool::HugePages::NotAsked => "not-asked",
            edgepool::HugePages::Unavailable(_) => "unavailable",
        },
        file.huge_page_bytes().unwrap_or(0)
    ));
    Ok(proto)
}

/// Loads the model as `how` says, runs one inference, and prints one line of `key=value` figures.
pub fn load_with(path: &str, how: &Load) -> TractResult<()> {
    let rss_before_kb = status_kb("VmRSS:");
    let heap_before = live_heap(c"live_heap_bytes");
    let t0 = Instant::now();
    let threads = how.threads.max(1);
    let guard = how.mode.map(if threads > 1 { edgepool::load_phase_process_with } else { edgepool::load_phase_with });
    let mut models = if threads == 1 {
        vec![build(decode(path, how)?)?]
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| build(decode(path, how)?))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect::<TractResult<Vec<_>>>()
        })?
    };
    let report = guard.map(|g| g.finish());
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let peak_kb = status_kb("VmHWM:");
    let after_kb = status_kb("VmRSS:");
    let heap_peak = live_heap(c"live_heap_peak");
    let mut seed = 99u64;
    let input: Tensor = tract_ndarray::Array4::from_shape_fn((1, 3, 32, 32), |_| rng(&mut seed)).into();
    let t = Instant::now();
    let warmed = if how.prefault_free > 0 { edgepool::prefault_free(how.prefault_free) } else { 0 };
    let prefault_ms = t.elapsed().as_secs_f64() * 1e3;
    let f0 = minor_faults();
    let t1 = Instant::now();
    let model = models.remove(0);
    let out = model.run(tvec!(input.clone().into()))?;
    let infer_ms = t1.elapsed().as_secs_f64() * 1e3;
    let infer_faults = minor_faults() - f0;
    // Every other thread's model computes the same output as the first, bit for bit.
    for m in &models {
        let o = m.run(tvec!(input.clone().into()))?;
        if o[0] != out[0] {
            tract_onnx::tract_core::internal::bail!("the models loaded by different threads compute different outputs");
        }
    }
    let view = out[0].to_plain_array_view::<f32>()?;
    let sum: f64 = view.iter().map(|&v| v as f64).sum();
    let first: Vec<String> = view.iter().take(4).map(|v| format!("{v:e}")).collect();
    let alloc = match (choice(), how.mode) {
        (Choice::System | Choice::Count, _) => "system",
        (Choice::Mimalloc, _) => "mimalloc",
        (Choice::Jemalloc, _) => "jemalloc",
        (Choice::Edgepool, Some(edgepool::PhaseMode::Arena)) => "edgepool+arena",
        (Choice::Edgepool, Some(_)) => "edgepool+phase",
        (Choice::Edgepool, None) => "edgepool",
    };
    print!(
        "allocator={alloc} threads={threads} load_ms={load_ms:.1} infer_ms={infer_ms:.1} infer_faults={infer_faults} peak_rss={} rss_after_load={} rss_before={} out_sum={sum:e} out_first={}",
        peak_kb * 1024,
        after_kb * 1024,
        rss_before_kb * 1024,
        first.join(",")
    );
    if let Some(h) = HUGE.get() {
        print!(" huge_pages={h}");
    }
    if how.prefault_free > 0 {
        print!(" prefaulted={warmed} prefault_ms={prefault_ms:.1}");
    }
    if let (Some(b), Some(p)) = (heap_before, heap_peak) {
        print!(" heap_before={b} heap_peak={p}");
    }
    if choice() == Choice::Edgepool {
        let c = edgepool::stats().counters;
        print!(" lock_contended={} lock_wait_ms={:.1}", c.lock_contended, c.lock_wait_ns as f64 / 1e6);
    }
    if let Some(r) = report {
        print!(
            " phase_allocations={} phase_peak={} phase_survivors={} phase_released={} phase_os_before={} phase_os_after={}",
            r.allocations, r.peak_bytes, r.survivor_bytes, r.released_bytes, r.os_bytes_before, r.os_bytes_after
        );
    }
    println!();
    if how.hold_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(how.hold_ms));
    }
    drop(model);
    Ok(())
}
