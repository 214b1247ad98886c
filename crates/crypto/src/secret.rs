//! Key material that is zeroized on drop, locked in RAM where the kernel allows, and never printed.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use zeroize::Zeroize;

/// One page, page-aligned: a secret of up to a page gets pages of its own, so that
/// `munlock` when it is dropped cannot unlock another secret sharing the page (mlock does
/// not nest: one `munlock` undoes every `mlock` of the page).
#[repr(C, align(4096))]
struct Page([u8; PAGE]);

const PAGE: usize = 4096;

enum Store {
    /// Secrets up to a page (keys, passphrases): an exclusive page.
    Page(Box<Page>),
    /// Larger ones (key files): a plain allocation.
    Heap(Box<[u8]>),
}

/// A heap buffer for keys and passphrases.
///
/// The allocation never moves (it is boxed and never resized), so the `mlock` taken on
/// creation covers the key for its whole life. Secrets up to 4 KiB live on a page of their
/// own. Locking is best-effort: an unprivileged process with a small `RLIMIT_MEMLOCK` still
/// works, just without it.
pub struct SecretBytes {
    store: Store,
    len: usize,
    locked: bool,
}

impl SecretBytes {
    /// A zero-filled secret of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let store = if len <= PAGE {
            Store::Page(Box::new(Page([0; PAGE])))
        } else {
            Store::Heap(vec![0u8; len].into_boxed_slice())
        };
        let mut s = SecretBytes {
            store,
            len,
            locked: false,
        };
        s.locked = len > 0 && lock(s.whole());
        s
    }

    /// Copies `data` into a new secret. The caller stays responsible for wiping `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut s = Self::zeroed(data.len());
        s.copy_from_slice(data);
        s
    }

    /// Takes a vector, wiping the vector's own buffer after the copy.
    pub fn from_vec(mut data: Vec<u8>) -> Self {
        let s = Self::from_slice(&data);
        data.zeroize();
        s
    }

    /// A secret filled from the operating system's random source.
    pub fn random(len: usize) -> crate::Result<Self> {
        let mut s = Self::zeroed(len);
        crate::random_bytes(&mut s)?;
        Ok(s)
    }

    /// Whether `mlock` succeeded for this buffer.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// The whole allocation (a full page for small secrets).
    fn whole(&self) -> &[u8] {
        match &self.store {
            Store::Page(p) => &p.0,
            Store::Heap(b) => b,
        }
    }

    fn whole_mut(&mut self) -> &mut [u8] {
        match &mut self.store {
            Store::Page(p) => &mut p.0,
            Store::Heap(b) => b,
        }
    }
}

fn lock(buf: &[u8]) -> bool {
    if buf.is_empty() {
        return false;
    }
    dump_advice(buf, libc::MADV_DONTDUMP);
    // SAFETY: mlock only reads the address range, which is a live allocation owned by the caller.
    unsafe { libc::mlock(buf.as_ptr().cast(), buf.len()) == 0 }
}

fn unlock(buf: &[u8]) {
    // SAFETY: munlock only reads the address range, a live allocation owned by the caller.
    unsafe {
        libc::munlock(buf.as_ptr().cast(), buf.len());
    }
    dump_advice(buf, libc::MADV_DODUMP);
}

/// Keeps the whole pages of `buf` out of core dumps (`MADV_DONTDUMP`), or puts them back
/// (`MADV_DODUMP`) once the secret is wiped. Best-effort, like the locking: a core dump is
/// already prevented by the non-dumpable flag of the processes holding keys; this covers a
/// library user whose process stays dumpable. Only pages wholly inside `buf` are touched.
fn dump_advice(buf: &[u8], advice: libc::c_int) {
    let start = (buf.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (buf.as_ptr() as usize + buf.len()) & !(PAGE - 1);
    if end > start {
        // SAFETY: madvise with DONTDUMP/DODUMP only changes how the range is dumped; the
        // range is page-aligned and lies inside a live allocation owned by the caller.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, advice);
        }
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        self.whole_mut().zeroize();
        if self.locked {
            unlock(self.whole());
        }
    }
}

/// A value (expanded key schedules) on pages of its own, mlocked for its whole life.
/// `T` must wipe itself on drop; this only adds the locking, and never moves the value
/// once it is in place (build it with [`LockedBox::new_with`] from a blank value and fill
/// it in place, so no copy of the key material is left in a moved-from stack slot).
pub(crate) struct LockedBox<T> {
    inner: Box<Paged<T>>,
    locked: bool,
}

#[repr(C, align(4096))]
struct Paged<T>(T);

impl<T> LockedBox<T> {
    /// Boxes `blank` (which must hold no secret yet), locks it, then lets `fill` write the
    /// secret into it in place; fails if `fill` does.
    pub(crate) fn new_with<E>(
        blank: T,
        fill: impl FnOnce(&mut T) -> Result<(), E>,
    ) -> Result<Self, E> {
        let inner = Box::new(Paged(blank));
        let whole = (&*inner as *const Paged<T>).cast::<u8>();
        // SAFETY: a view of the live allocation just made, `size_of::<Paged<T>>()` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(whole, std::mem::size_of::<Paged<T>>()) };
        dump_advice(bytes, libc::MADV_DONTDUMP);
        // SAFETY: mlock only reads the address range: the live allocation just made, whose
        // size (a multiple of the page size, from the alignment) is that of `Paged<T>`.
        let locked = unsafe {
            libc::mlock(
                (&*inner as *const Paged<T>).cast(),
                std::mem::size_of::<Paged<T>>(),
            ) == 0
        };
        let mut b = LockedBox { inner, locked };
        fill(&mut b.inner.0)?;
        Ok(b)
    }

    /// Whether `mlock` succeeded.
    #[cfg(test)]
    pub(crate) fn is_locked(&self) -> bool {
        self.locked
    }
}

impl<T> Drop for LockedBox<T> {
    fn drop(&mut self) {
        // The value wipes itself right after (field drop); the pages are ours alone.
        if self.locked {
            // SAFETY: the range locked in `new_with`, still allocated here.
            unsafe {
                libc::munlock(
                    (&*self.inner as *const Paged<T>).cast(),
                    std::mem::size_of::<Paged<T>>(),
                );
            }
        }
    }
}

impl<T> Deref for LockedBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner.0
    }
}

impl<T> DerefMut for LockedBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner.0
    }
}

impl<T> fmt::Debug for LockedBox<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LockedBox([REDACTED])")
    }
}

/// How much of a thread's stack below the first cipher call is locked (with everything
/// above it), and how much a scrub wipes.
const STACK_GUARD: usize = 64 << 10;

/// Locks the stack region the ciphers use on this thread, and wipes it when the thread ends.
struct StackGuard;

impl StackGuard {
    fn new() -> StackGuard {
        // The main thread's stack grows on demand: a range below it not yet touched is
        // not mapped, and mlock of it failed whole (a key copy then landed in swappable
        // stack, by the stack's random start about one run in two). Touch it first.
        grow_stack();
        let marker = 0u8;
        let here = std::hint::black_box(&marker) as *const u8 as usize;
        // Up to the stack's top too: the thread may use keys later in shallower frames
        // than this one (the main thread unlocks deep in a call chain, then serves from
        // near the top; a round key spilled there was in swappable stack).
        let top = stack_top().unwrap_or(here + PAGE).next_multiple_of(PAGE);
        let bottom = here.saturating_sub(STACK_GUARD) & !(PAGE - 1);
        let near = (here + PAGE).next_multiple_of(PAGE).min(top);
        // SAFETY: mlock only changes page attributes of the range, which is this thread's
        // stack: from the top (or, where the locked-memory limit refuses that much, from
        // just above the current frame) down to below it, where deeper calls run, mapped
        // by `grow_stack` (should it still fail, nothing happens).
        unsafe {
            if libc::mlock(bottom as *const libc::c_void, top - bottom) != 0 {
                libc::mlock(bottom as *const libc::c_void, near - bottom);
            }
        }
        StackGuard
    }
}

impl Drop for StackGuard {
    fn drop(&mut self) {
        // Runs at thread exit, near the top of the stack: wipes the frames the ciphers used
        // (thread stacks are cached and reused without being cleared).
        scrub_stack();
    }
}

thread_local! {
    static STACK_GUARD_TLS: StackGuard = StackGuard::new();
}

/// Called before cipher work on a thread: the first call locks the thread's stack from
/// [`STACK_GUARD`] below it up to the top.
pub(crate) fn guard_stack() {
    STACK_GUARD_TLS.with(|_| {});
}

/// Overwrites 16-byte blocks (IVs, encrypted tweaks) with zeros, one volatile 16-byte store
/// each: `zeroize` on the flattened bytes stores byte by byte, which for a request's eight
/// IVs cost more than a tenth of encrypting a 512-byte sector.
pub(crate) fn wipe_blocks(blocks: &mut [[u8; 16]]) {
    for b in blocks {
        // SAFETY: `b` is a valid, aligned, exclusive reference to 16 bytes; a volatile
        // store is never elided.
        unsafe { core::ptr::write_volatile(b, [0u8; 16]) };
    }
}

/// The highest address of this thread's stack, from pthread (for the main thread it reads
/// /proc/self/maps); `None` if it cannot tell.
fn stack_top() -> Option<usize> {
    // SAFETY: `attr` is filled by pthread_getattr_np for the calling thread before it is
    // read, and destroyed once; the out-pointers are valid locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let r = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (r == 0 && !addr.is_null()).then(|| addr as usize + size)
    }
}

/// Writes zeros over two pages more than [`STACK_GUARD`] of stack below the caller, so that
/// all of it is mapped.
#[inline(never)]
fn grow_stack() {
    let mut z = [0u8; STACK_GUARD + 2 * PAGE];
    std::hint::black_box(&mut z);
}

/// Runs key setup `f` in frames below the caller's, then wipes them ([`scrub_stack`]). A
/// setup inlined into the caller's own frame left a round key there, out of the wipe's
/// reach (the key_hygiene and suspend tests found it once other code moved the inlining).
#[inline(never)]
pub(crate) fn scrubbed<T>(f: impl FnOnce() -> T) -> T {
    // The stack it runs on locked first (so nothing of it is swapped out meanwhile).
    guard_stack();
    let r = below(f);
    scrub_stack();
    clear_vector_registers();
    r
}

/// Zeroes every vector register: key setup leaves round keys in them, and the first call
/// a thread makes through a lazily bound libc symbol saves them all (the dynamic linker's
/// `_dl_runtime_resolve_xsavec`) onto that thread's stack, where nothing wipes them (the
/// suspend test found the tweak key there, saved when the server spawned its first
/// thread; which registers still held key bytes changed with unrelated code).
#[inline(never)]
pub(crate) fn clear_vector_registers() {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! zero {
            ($($r:literal),*) => {
                concat!($("vpxord zmm", $r, ", zmm", $r, ", zmm", $r, "\n"),*)
            };
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: only zeroes vector registers, all declared clobbered, with the
            // 512-bit form, which needs only AVX-512F (the 128-bit form on xmm16-31 would
            // need AVX-512VL); the CPU has AVX-512F.
            unsafe {
                core::arch::asm!(
                    zero!(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                        20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31),
                    out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                    out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                    out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                    out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                    out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                    out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                    out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
                    out("zmm28") _, out("zmm29") _, out("zmm30") _, out("zmm31") _,
                    options(nostack, nomem, preserves_flags),
                );
            }
        } else if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: VZEROALL only zeroes ymm0-15, all declared clobbered; the CPU has AVX.
            unsafe {
                core::arch::asm!(
                    "vzeroall",
                    out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                    out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                    out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                    out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
                    options(nostack, nomem, preserves_flags),
                );
            }
        } else {
            // SAFETY: only zeroes xmm0-15 (SSE2, which every x86_64 CPU has), all declared
            // clobbered.
            unsafe {
                core::arch::asm!(
                    "pxor xmm0, xmm0", "pxor xmm1, xmm1", "pxor xmm2, xmm2", "pxor xmm3, xmm3",
                    "pxor xmm4, xmm4", "pxor xmm5, xmm5", "pxor xmm6, xmm6", "pxor xmm7, xmm7",
                    "pxor xmm8, xmm8", "pxor xmm9, xmm9", "pxor xmm10, xmm10", "pxor xmm11, xmm11",
                    "pxor xmm12, xmm12", "pxor xmm13, xmm13", "pxor xmm14, xmm14", "pxor xmm15, xmm15",
                    out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                    out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                    out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                    out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
                    options(nostack, nomem, preserves_flags),
                );
            }
        }
    }
}

/// Calls `f` in a frame of its own.
#[inline(never)]
fn below<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// Overwrites the stack below the caller with zeros (64 KiB): key setup (key expansion
/// into values that are then moved into place) and the drop of keys (drop glue that moves
/// a value before it is wiped) leave copies in dead stack frames, which a call made right
/// after it from the same frame reuses and wipes. Public for a thread that drops keys and
/// then waits (a suspend).
#[inline(never)]
pub fn scrub_stack() {
    let mut z = [0u8; STACK_GUARD];
    std::hint::black_box(&mut z);
}

/// Overwrites the `N` bytes of stack below the caller with zeros: the authenticated
/// sector engines (intrinsics, RustCrypto) spill round keys, hash key powers and HMAC key
/// blocks into their frames, which a suspended volume must not keep (the suspend test
/// scans for them). How deep each engine's frames reach is measured by
/// `aead_sector::tests::every_engine_stays_within_its_wipe`.
///
/// With AVX-512 the zeros are stored 64 bytes at a time by our own loop: glibc's `memset`
/// (`rep stosb` at these sizes) took ~60 ns for 7 KiB where the loop takes ~32, and a
/// 4 KiB AES-GCM sector takes ~200 ns.
#[inline(never)]
pub(crate) fn scrub_frames<const N: usize>() {
    const { assert!(N > 0 && N.is_multiple_of(64)) };
    // One buffer for both ways of zeroing it, so that either reaches as deep.
    let mut z = core::mem::MaybeUninit::<[u8; N]>::uninit();
    let start = z.as_mut_ptr().cast::<u8>();
    #[cfg(target_arch = "x86_64")]
    let vector = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let vector = false;
    if vector {
        // SAFETY: stores zeros to the N bytes of `z` (a local array on this frame; the
        // loop's last store ends at its last byte: N is a multiple of 64), with the
        // AVX-512F the CPU was just found to have (the VEX `vpxor` zeroes all of zmm0);
        // `vzeroupper` leaves no dirty upper halves to slow SSE code after it on Intel;
        // the registers it changes (zmm0-15's upper bits) are declared clobbered.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            core::arch::asm!(
                "vpxor xmm0, xmm0, xmm0",
                "2:",
                "vmovdqu64 zmmword ptr [{p}], zmm0",
                "add {p}, 64",
                "cmp {p}, {end}",
                "jb 2b",
                "vzeroupper",
                p = inout(reg) start => _,
                end = in(reg) start.wrapping_add(N),
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                options(nostack),
            );
        }
    } else {
        // SAFETY: `start` is the N writable bytes of `z`.
        unsafe { start.write_bytes(0, N) };
    }
    std::hint::black_box(&mut z);
}

impl Clone for SecretBytes {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl Deref for SecretBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.whole()[..self.len]
    }
}

impl DerefMut for SecretBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.whole_mut()[..len]
    }
}

impl PartialEq for SecretBytes {
    /// Constant-time in the contents (length is not secret).
    fn eq(&self, other: &Self) -> bool {
        constant_time_eq(self, other)
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes([REDACTED; {}])", self.len)
    }
}

/// Compares two byte strings without an early exit on the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Bumped in a child after a fork, the first time [`fork_generation`] sees the wiped mark.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// One byte on a page the kernel zeroes in a forked child (`MADV_WIPEONFORK`, Linux 4.14);
/// `None` where the advice is refused.
fn fork_mark() -> Option<&'static AtomicU8> {
    static MARK: OnceLock<Option<usize>> = OnceLock::new();
    let addr = *MARK.get_or_init(|| {
        // SAFETY: an anonymous private mapping of one page, checked for failure; it is
        // never unmapped, so the address stays valid for the process's life.
        unsafe {
            let page = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if page == libc::MAP_FAILED {
                return None;
            }
            if libc::madvise(page, 4096, libc::MADV_WIPEONFORK) != 0 {
                libc::munmap(page, 4096);
                return None;
            }
            (*page.cast::<AtomicU8>()).store(1, Ordering::Release);
            Some(page as usize)
        }
    });
    // SAFETY: the page above, mapped for good, holds an AtomicU8 at its start.
    addr.map(|a| unsafe { &*(a as *const AtomicU8) })
}

/// Changes in a forked child (before its first draw of anything keyed by it goes on), so
/// per-process state such as the IV stream can tell it must start afresh: a fork count
/// that a child moves the first time it looks, one load when nothing forked; the process
/// id (a system call) where the kernel has no `MADV_WIPEONFORK`.
pub(crate) fn fork_generation() -> u64 {
    match fork_mark() {
        Some(mark) => {
            if mark.load(Ordering::Acquire) == 0 {
                // A forked child. Bumped before the mark is set again, so a thread that
                // sees the mark set sees the new count too (two bumps are harmless).
                FORKS.fetch_add(1, Ordering::SeqCst);
                mark.store(1, Ordering::Release);
            }
            FORKS.load(Ordering::Acquire)
        }
        None => u64::from(std::process::id()) | 1 << 63,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_bytes() {
        let s = SecretBytes::from_slice(b"hunter2");
        let d = format!("{s:?}");
        assert!(!d.contains("hunter2") && !d.contains("104"), "{d}");
        assert_eq!(&s[..], b"hunter2");
    }

    #[test]
    fn small_secrets_get_exclusive_locked_pages() {
        let a = SecretBytes::from_slice(b"first key");
        let b = SecretBytes::from_slice(b"second key");
        let page = |s: &SecretBytes| s.as_ptr() as usize / PAGE;
        assert_ne!(page(&a), page(&b), "two secrets share a page");
        assert_eq!(a.as_ptr() as usize % PAGE, 0);
        assert_eq!((a.len(), &a[..]), (9, &b"first key"[..]));
        // Locking may fail without privileges; as root (the test machines) it must not.
        if is_root() {
            assert!(a.is_locked() && b.is_locked());
        }
        let big = SecretBytes::zeroed(3 * PAGE + 5);
        assert_eq!(big.len(), 3 * PAGE + 5);
        assert_eq!(SecretBytes::zeroed(0).len(), 0);
    }

    #[test]
    fn locked_box_is_page_aligned_and_redacted() {
        let b: LockedBox<[u8; 32]> = LockedBox::new_with([0u8; 32], |k| {
            k.copy_from_slice(&[7; 32]);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(&*b as *const [u8; 32] as usize % PAGE, 0);
        assert_eq!(*b, [7; 32]);
        assert_eq!(format!("{b:?}"), "LockedBox([REDACTED])");
        if is_root() {
            assert!(b.is_locked());
        }
        assert!(
            excluded_from_core_dumps(&*b as *const [u8; 32] as usize),
            "key schedule pages must be MADV_DONTDUMP"
        );
    }

    /// Whether the mapping holding `addr` has the `dd` flag (MADV_DONTDUMP) in smaps.
    fn excluded_from_core_dumps(addr: usize) -> bool {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.split_whitespace().any(|f| f == "dd");
            }
        }
        panic!("{addr:#x} is in no mapping of /proc/self/smaps");
    }

    #[test]
    fn secrets_are_kept_out_of_core_dumps() {
        let small = SecretBytes::from_slice(b"a passphrase");
        assert!(excluded_from_core_dumps(small.as_ptr() as usize));
        let big = SecretBytes::zeroed(5 * PAGE);
        let inner = (big.as_ptr() as usize).next_multiple_of(PAGE);
        assert!(excluded_from_core_dumps(inner), "whole pages of a key file");
    }

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    }

    #[test]
    fn random_differs() {
        let a = SecretBytes::random(32).unwrap();
        let b = SecretBytes::random(32).unwrap();
        assert_ne!(a, b);
        assert!(constant_time_eq(&a, &a.clone()));
    }

    #[test]
    fn a_forked_child_draws_ivs_its_parent_does_not() {
        if fork_mark().is_none() {
            eprintln!("MADV_WIPEONFORK refused here: testing the getpid fallback");
        }
        let mut before = [0u8; 16];
        crate::iv_stream::fill(&mut before).unwrap();
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is two writable ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [rd, wr] = fds;
        // SAFETY: the child only draws, writes to the pipe and exits without unwinding.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: the child's copy of the read end, unused by it.
            unsafe { libc::close(rd) };
            let mut iv = [0u8; 16];
            let ok = crate::iv_stream::fill(&mut iv).is_ok();
            // SAFETY: `iv` is 16 readable bytes; the child leaves at once.
            unsafe {
                libc::write(wr, iv.as_ptr().cast(), if ok { 16 } else { 0 });
                libc::_exit(0);
            }
        }
        // SAFETY: the parent's write end, closed so that a child that dies early ends
        // the read below instead of leaving it waiting.
        unsafe { libc::close(wr) };
        let mut parent = [0u8; 16];
        crate::iv_stream::fill(&mut parent).unwrap();
        let mut child = [0u8; 16];
        // SAFETY: `child` is 16 writable bytes; `pid` is our child.
        let got = unsafe {
            let got = libc::read(rd, child.as_mut_ptr().cast(), 16);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(rd);
            got
        };
        assert_eq!(got, 16, "the child drew no IV");
        // Without the rekey the child's draw would be the parent's next one.
        assert_ne!(child, parent, "the child continued its parent's stream");
    }
}
