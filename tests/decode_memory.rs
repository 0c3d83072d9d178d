//! Decoding allocates in proportion to the bytes a payload holds, never to
//! the lengths it declares (PROTOCOL.md §3, §8): an allocator that notes the
//! largest allocation of each thread watches every payload decode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ratekeeper::proto::{ClientFrame, FrameError, ServerFrame, decode_payload};

/// The system allocator, noting the largest allocation of each thread.
struct NotingLargest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

// SAFETY: every call is forwarded to `System` unchanged.
unsafe impl GlobalAlloc for NotingLargest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: NotingLargest = NotingLargest;

/// The largest allocation `decode` makes, and what it returns.
fn largest_allocation<T>(decode: impl FnOnce() -> T) -> (usize, T) {
    LARGEST.with(|largest| largest.set(0));
    let result = decode();
    (LARGEST.with(Cell::get), result)
}

/// What PROTOCOL.md §8 lets one decode allocate for a payload of `len`
/// bytes: sixteen times its length, and 1 KiB whatever the payload.
fn bound(len: usize) -> usize {
    (16 * len).max(1024)
}

fn u64le(value: u64) -> [u8; 8] {
    value.to_le_bytes()
}

fn string(text: &str) -> Vec<u8> {
    let mut out = u64le(text.len() as u64).to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}

/// A client frame: request id 1, the request's tag, then `fields`.
fn client(tag: u32, fields: &[&[u8]]) -> Vec<u8> {
    let mut out = u64le(1).to_vec();
    out.extend_from_slice(&tag.to_le_bytes());
    for field in fields {
        out.extend_from_slice(field);
    }
    out
}

/// An `Acquire` of limit "gpt", no tenant, no priority, with `cost` (its
/// tag and fields).
fn acquire(cost: &[&[u8]]) -> Vec<u8> {
    let mut fields: Vec<&[u8]> = Vec::new();
    let limit = string("gpt");
    fields.extend([&limit[..], &[0], &[0]]);
    fields.extend(cost);
    client(1, &fields)
}

#[test]
fn declared_lengths_are_refused_before_they_are_allocated() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "Hello whose client name declares 20 MiB",
            client(0, &[&1u16.to_le_bytes(), &u64le(20 << 20)]),
        ),
        (
            "Hello whose client name declares 200 MiB",
            client(0, &[&1u16.to_le_bytes(), &u64le(200 << 20)]),
        ),
        (
            "Acquire of 200,000 chat messages",
            acquire(&[&1u32.to_le_bytes(), &u64le(200_000)]),
        ),
        (
            "Acquire of a conversation with 800,000 system blocks",
            acquire(&[&2u32.to_le_bytes(), &string("openai"), &u64le(800_000)]),
        ),
        (
            "Acquire of a chat message with 800,000 parts",
            acquire(&[
                &1u32.to_le_bytes(),
                &u64le(1),
                &string("user"),
                &[0],
                &u64le(800_000),
            ]),
        ),
        (
            "Feedback with 400,000 headers",
            client(
                10,
                &[
                    &string("gpt"),
                    &429u16.to_le_bytes(),
                    &u64le(0),
                    &u64le(400_000),
                ],
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (what, payload) in cases {
        let (largest, result) = largest_allocation(|| decode_payload::<ClientFrame>(&payload));
        if !matches!(result, Err(FrameError::Malformed(_))) {
            failures.push(format!("{what}: {result:?}"));
        }
        if largest > bound(payload.len()) {
            failures.push(format!(
                "{what}: a {}-byte payload made an allocation of {largest} bytes",
                payload.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_daemon_answer_declaring_a_long_list_is_refused_before_it_is_allocated() {
    // request id 1, Status, store "redis", 300,000 limits.
    let mut payload = u64le(1).to_vec();
    payload.extend_from_slice(&7u32.to_le_bytes());
    payload.extend_from_slice(&string("redis"));
    payload.extend_from_slice(&u64le(300_000));
    let (largest, result) = largest_allocation(|| decode_payload::<ServerFrame>(&payload));
    assert!(
        matches!(result, Err(FrameError::Malformed(_))),
        "{result:?}"
    );
    assert!(largest <= bound(payload.len()), "allocated {largest} bytes");
}

#[test]
fn a_frame_allocates_what_it_holds() {
    // A Hello whose name fills the frame: the name is allocated, once.
    let name = "n".repeat(100_000);
    let payload = client(0, &[&1u16.to_le_bytes(), &string(&name)]);
    let (largest, result) = largest_allocation(|| decode_payload::<ClientFrame>(&payload));
    assert!(result.is_ok(), "{result:?}");
    assert!(
        (name.len()..=bound(payload.len())).contains(&largest),
        "allocated {largest} bytes"
    );
}
