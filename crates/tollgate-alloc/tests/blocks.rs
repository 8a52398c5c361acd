//! The allocator as a test binary's global allocator: every layout's block is aligned as
//! asked, holds what was written into it through a resize, and zeroed blocks are zero.

use std::alloc::{GlobalAlloc, Layout};

#[global_allocator]
static ALLOC: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

#[test]
fn blocks_are_aligned_sized_and_kept_through_resizes() {
    for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
        for size in [1usize, 7, 8, 9, 24, 40, 100, 1000, 5000, 70_000] {
            let layout = Layout::from_size_align(size, align).expect("a valid layout");
            // SAFETY: the layout has a non-zero size; the block is written within its size,
            // resized with the layout it was allocated with, and freed once.
            unsafe {
                let p = ALLOC.alloc(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "size {size} align {align}");
                for i in 0..size {
                    *p.add(i) = (i % 251) as u8;
                }
                let grown = size * 3;
                let q = ALLOC.realloc(p, layout, grown);
                assert!(!q.is_null());
                assert_eq!(q as usize % align, 0, "resized: size {size} align {align}");
                for i in 0..size {
                    assert_eq!(*q.add(i), (i % 251) as u8, "byte {i} kept");
                }
                ALLOC.dealloc(q, Layout::from_size_align(grown, align).expect("valid"));

                let z = ALLOC.alloc_zeroed(layout);
                assert!(!z.is_null());
                assert_eq!(z as usize % align, 0);
                assert!((0..size).all(|i| *z.add(i) == 0), "zeroed: size {size}");
                ALLOC.dealloc(z, layout);
            }
        }
    }
}

#[test]
fn collections_run_on_it() {
    let mut v: Vec<String> = (0..10_000).map(|i| format!("item-{i}")).collect();
    v.retain(|s| s.len() % 2 == 0);
    let m: std::collections::HashMap<u128, String> = v
        .iter()
        .enumerate()
        .map(|(i, s)| (i as u128, s.clone()))
        .collect();
    assert_eq!(m.len(), v.len());
    assert!(m.values().all(|s| s.starts_with("item-")));
}
