//! Measures the internal waste that the finer classes below 64 B save.
//!
//! Records every request size of a workload made of what parse-heavy loaders do (strings, vectors,
//! boxed nodes, B-tree and hash maps), then computes the bytes reserved for those requests with
//! edgepool's classes (16, 32, 48, then the ×1.5 ladder from 64) and with the ladder alone (every
//! request below 64 B in a 64 B slot). Run: `cargo run --release --example class_waste`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const BUCKETS: usize = 4097;
static HIST: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];
static RECORD: AtomicBool = AtomicBool::new(false);

struct Recording;

// SAFETY: forwards to the system allocator; recording only touches atomics.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if RECORD.load(Ordering::Relaxed) && l.size() < BUCKETS {
            HIST[l.size()].fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Recording = Recording;

#[derive(Debug)]
#[allow(dead_code)]
enum Node {
    Leaf(String),
    Op(Box<Node>, Box<Node>),
    List(Vec<Node>),
}

fn workload() -> usize {
    let mut total = 0;
    // A "model description" as text: names, shapes, attributes.
    let mut text = String::new();
    for i in 0..20_000 {
        text.push_str(&format!(
            "node_{i} op=Conv{} in=[t{},t{}] shape=[1,{},{},{}]\n",
            i % 7,
            i,
            i + 1,
            i % 512,
            i % 64,
            i % 3
        ));
    }
    let mut by_name: HashMap<String, Vec<String>> = HashMap::new();
    let mut ordered: BTreeMap<String, usize> = BTreeMap::new();
    let mut nodes = Vec::new();
    for line in text.lines() {
        let parts: Vec<String> = line.split(' ').map(str::to_owned).collect();
        let name = parts[0].clone();
        ordered.insert(name.clone(), parts.len());
        nodes.push(Node::Op(
            Box::new(Node::Leaf(parts[1].clone())),
            Box::new(Node::List(parts.iter().skip(2).map(|p| Node::Leaf(p.clone())).collect())),
        ));
        by_name.insert(name, parts);
    }
    total += by_name.len() + ordered.len() + nodes.len();
    total
}

fn reserved(size: usize, classes: &[usize]) -> usize {
    *classes.iter().find(|&&c| c >= size).unwrap()
}

fn main() {
    RECORD.store(true, Ordering::Relaxed);
    let n = workload();
    RECORD.store(false, Ordering::Relaxed);
    let ours = edgepool::classes::CLASS_SIZES;
    let ladder: Vec<usize> = ours.iter().copied().filter(|&c| c >= 64).collect();
    let (mut reqs, mut requested, mut with_fine, mut without) = (0u64, 0u64, 0u64, 0u64);
    let mut below64 = 0u64;
    for (size, h) in HIST.iter().enumerate() {
        let count = h.load(Ordering::Relaxed);
        if count == 0 || size == 0 {
            continue;
        }
        reqs += count;
        if size < 64 {
            below64 += count;
        }
        requested += count * size as u64;
        with_fine += count * reserved(size, &ours) as u64;
        without += count * reserved(size, &ladder) as u64;
    }
    println!(
        "workload objects: {n}; requests ≤ 4 KiB: {reqs}; below 64 B: {below64} ({:.1} %)",
        100.0 * below64 as f64 / reqs as f64
    );
    println!("bytes requested:                  {requested}");
    println!(
        "reserved with 16/32/48 + ladder:  {with_fine} (waste {:.1} %)",
        100.0 * (with_fine - requested) as f64 / with_fine as f64
    );
    println!(
        "reserved with the ladder alone:   {without} (waste {:.1} %)",
        100.0 * (without - requested) as f64 / without as f64
    );
    println!(
        "saved by the finer classes:       {:.1} % of reserved bytes",
        100.0 * (without - with_fine) as f64 / without as f64
    );
}
