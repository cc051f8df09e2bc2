//! The only module of roam-shim with `unsafe` code: the few libvirt and kernel calls that no
//! safe wrapper covers, each behind a safe function.
//!
//! - libvirt **domain lifecycle events** (`virConnectDomainEventRegisterAny` with
//!   `VIR_DOMAIN_EVENT_ID_LIFECYCLE`, and `VIR_DOMAIN_EVENT_ID_REBOOT` for guest resets):
//!   [`LifecycleSubscription`] hands every event to a channel as a [`RawLifecycle`] stamped
//!   with the wall-clock time **inside the callback**, so the switch (the target's
//!   activation) can be timed against the moment libvirt told us; and QEMU's own QMP `STOP`
//!   (`virConnectDomainQemuMonitorEventRegister`, libvirt-qemu) stamped by QEMU, which libvirt
//!   hands on before its own *suspended* event (see [`QEMU_STOP_EVENT`]);
//! - **job control** the `virt` 0.5 crate does not wrap: [`abort_job`], [`start_post_copy`];
//! - the **TUN ioctls** that create a persistent kernel tap ([`create_persistent_tap`]):
//!   tun/tap creation over rtnetlink is refused by the kernel (`tun_validate` returns
//!   `EOPNOTSUPP`), so the tap is made the way `ip tuntap add` makes it.
//!
//! Audit notes: no raw pointer leaves this module; every `unsafe` block has a SAFETY comment;
//! the callback never panics across the FFI boundary (it only formats and sends).
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_longlong, c_short, c_uint, c_ulong, c_void};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::UnboundedSender;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::sys;

/// [`RawLifecycle::event`] of a guest reset: not a `virDomainEventType` (those are ≥ 0), the
/// `VIR_DOMAIN_EVENT_ID_REBOOT` callback, which has no event code of its own.
pub const RESET_EVENT: i32 = -1;

/// [`RawLifecycle::event`] of QEMU's own QMP `STOP` event: the guest's vCPUs stopped (for any
/// reason: the shim decides what it means). libvirt queues a domain's raw QMP events for its
/// clients as they are read, but emits its *suspended* lifecycle event for the same stop only
/// once it holds the domain's lock, which can be hundreds of ms later; the target's
/// announcement waits for the first report of the stop.
pub const QEMU_STOP_EVENT: i32 = -2;

/// One lifecycle event as libvirt delivered it, stamped when the callback ran (QEMU's events:
/// by QEMU).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawLifecycle {
    /// The domain's name.
    pub domain: String,
    /// `virDomainEventType`, or [`RESET_EVENT`].
    pub event: i32,
    /// The event's detail (`virDomainEvent*DetailType`).
    pub detail: i32,
    /// When it happened: the wall-clock time taken first thing in the callback, or QEMU's own
    /// timestamp for [`QEMU_STOP_EVENT`].
    pub at: SystemTime,
    /// When the callback ran (for libvirt's events, `at`).
    pub received: SystemTime,
}

static EVENT_LOOP: OnceLock<Result<(), String>> = OnceLock::new();

/// Register libvirt's default event loop implementation and run it on a thread of its own,
/// once per process. Must be called before opening a connection that subscribes to events.
pub fn start_event_loop() -> Result<(), String> {
    EVENT_LOOP
        .get_or_init(|| {
            virt::event::event_register_default_impl().map_err(|e| e.to_string())?;
            std::thread::Builder::new()
                .name("libvirt-events".into())
                .spawn(|| {
                    loop {
                        if virt::event::event_run_default_impl().is_err() {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })
                .map(|_| ())
                .map_err(|e| format!("cannot start libvirt's event loop thread: {e}"))
        })
        .clone()
}

/// What the callback owns: the sending side of the subscriber's channel.
struct CallbackData {
    tx: UnboundedSender<RawLifecycle>,
}

type LifecycleFn =
    unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, c_int, c_int, *mut c_void) -> c_int;
type GenericFn = unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void);

unsafe extern "C" fn lifecycle_callback(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) -> c_int {
    // the timestamp first: it is what the migrator times the switchover with
    let at = SystemTime::now();
    // SAFETY: `opaque` and `dom` are what libvirt passes to a callback registered by
    // `register` (see `deliver`).
    unsafe { deliver(dom, opaque, event, detail, at, at) };
    0
}

unsafe extern "C" fn reboot_callback(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    opaque: *mut c_void,
) {
    let at = SystemTime::now();
    // SAFETY: as in `lifecycle_callback`.
    unsafe { deliver(dom, opaque, RESET_EVENT, 0, at, at) };
}

unsafe extern "C" fn qemu_stop_callback(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    _event: *const c_char,
    seconds: c_longlong,
    micros: c_uint,
    _details: *const c_char,
    opaque: *mut c_void,
) {
    let received = SystemTime::now();
    // QEMU's timestamp (the host's wall clock when QEMU emitted the event); -1 if it had none
    let at = u64::try_from(seconds)
        .ok()
        .and_then(|s| UNIX_EPOCH.checked_add(Duration::new(s, micros.saturating_mul(1000))))
        .unwrap_or(received);
    // SAFETY: as in `lifecycle_callback` (registered by `register_qemu_stop`).
    unsafe { deliver(dom, opaque, QEMU_STOP_EVENT, 0, at, received) };
}

/// Send one event to the subscriber.
///
/// # Safety
/// `opaque` must be the `Box<CallbackData>` pointer given to `register` (libvirt keeps
/// passing it until it calls `free_callback_data`, after the last callback); `dom` must be
/// NULL or a domain valid for the duration of the callback.
unsafe fn deliver(
    dom: sys::virDomainPtr,
    opaque: *mut c_void,
    event: c_int,
    detail: c_int,
    at: SystemTime,
    received: SystemTime,
) {
    // SAFETY: the caller's contract.
    let data = unsafe { &*(opaque as *const CallbackData) };
    let domain = if dom.is_null() {
        String::new()
    } else {
        // SAFETY: `dom` is valid for the duration of the callback; virDomainGetName returns a
        // NUL-terminated string owned by `dom` (or NULL), which is copied before returning.
        unsafe {
            let p = sys::virDomainGetName(dom);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    };
    // a closed channel (subscriber gone) is fine: the subscription is about to be dropped
    let _ = data.tx.send(RawLifecycle {
        domain,
        event,
        detail,
        at,
        received,
    });
}

unsafe extern "C" fn free_callback_data(opaque: *mut c_void) {
    // SAFETY: libvirt calls the free callback exactly once per registration, with the pointer
    // registered in `register` (made by `Box::into_raw`), after the last event callback.
    drop(unsafe { Box::from_raw(opaque as *mut CallbackData) });
}

/// A subscription to the lifecycle and reset events of every domain of one connection;
/// deregistered when dropped. Events arrive only while [`start_event_loop`] runs.
pub struct LifecycleSubscription {
    conn: Connect,
    ids: Vec<c_int>,
    /// The QMP `STOP` subscription, if libvirt accepted it.
    qemu_stop: Option<c_int>,
}

impl LifecycleSubscription {
    /// Subscribe `conn` (opened after [`start_event_loop`]) and send every event to `tx`.
    pub fn new(
        conn: &Connect,
        tx: UnboundedSender<RawLifecycle>,
    ) -> Result<LifecycleSubscription, virt::error::Error> {
        let lifecycle: LifecycleFn = lifecycle_callback;
        // SAFETY: libvirt's documented VIR_DOMAIN_EVENT_CALLBACK cast: for
        // VIR_DOMAIN_EVENT_ID_LIFECYCLE it calls the function with the lifecycle signature,
        // which is what `lifecycle_callback` has. Both are `extern "C"` function pointers of
        // the same size.
        let lifecycle: GenericFn =
            unsafe { std::mem::transmute::<LifecycleFn, GenericFn>(lifecycle) };
        // VIR_DOMAIN_EVENT_ID_REBOOT's callback has the generic signature itself
        let reboot: GenericFn = reboot_callback;
        let mut sub = LifecycleSubscription {
            conn: conn.clone(),
            ids: Vec::new(),
            qemu_stop: None,
        };
        for (id, f) in [
            (sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle),
            (sys::VIR_DOMAIN_EVENT_ID_REBOOT, reboot),
        ] {
            // on an error `sub` drops here and deregisters what was registered
            sub.ids.push(register(conn, id as c_int, f, tx.clone())?);
        }
        // an earlier view of a migration's pause; without it the lifecycle event still comes
        match register_qemu_stop(conn, tx) {
            Ok(id) => sub.qemu_stop = Some(id),
            Err(e) => {
                tracing::warn!(error = %e, "no QMP STOP events from libvirt: a migration's pause is seen at libvirt's suspended event only")
            }
        }
        Ok(sub)
    }
}

/// Register for QMP `STOP` events of every domain of `conn`.
fn register_qemu_stop(
    conn: &Connect,
    tx: UnboundedSender<RawLifecycle>,
) -> Result<c_int, virt::error::Error> {
    register_with(tx, |data| {
        // SAFETY: `conn.as_ptr()` is a live connection (we hold a reference); a NULL domain
        // means every domain; the event name is a NUL-terminated literal that libvirt copies;
        // `qemu_stop_callback` has the virConnectDomainQemuMonitorEventCallback signature;
        // `data` stays valid until libvirt calls `free_callback_data`.
        unsafe {
            sys::virConnectDomainQemuMonitorEventRegister(
                conn.as_ptr(),
                std::ptr::null_mut(),
                c"STOP".as_ptr(),
                Some(qemu_stop_callback),
                data,
                Some(free_callback_data),
                0,
            )
        }
    })
}

/// Register `f` for event `id` of every domain of `conn`, with its own copy of `tx`.
fn register(
    conn: &Connect,
    id: c_int,
    f: GenericFn,
    tx: UnboundedSender<RawLifecycle>,
) -> Result<c_int, virt::error::Error> {
    register_with(tx, |data| {
        // SAFETY: as in `register_qemu_stop`; `f` has the signature libvirt calls for `id`
        // (see the callers).
        unsafe {
            sys::virConnectDomainEventRegisterAny(
                conn.as_ptr(),
                std::ptr::null_mut(),
                id,
                Some(f),
                data,
                Some(free_callback_data),
            )
        }
    })
}

/// Give libvirt a [`CallbackData`] holding `tx` through `call`, a registration that passes it
/// to the callback and frees it with `free_callback_data` after the last one; a failed
/// registration (negative id) did not take it, and it is freed here.
fn register_with(
    tx: UnboundedSender<RawLifecycle>,
    call: impl FnOnce(*mut c_void) -> c_int,
) -> Result<c_int, virt::error::Error> {
    let data = Box::into_raw(Box::new(CallbackData { tx }));
    let r = call(data as *mut c_void);
    if r < 0 {
        // SAFETY: registration failed, so libvirt did not take ownership of `data`.
        drop(unsafe { Box::from_raw(data) });
        return Err(virt::error::Error::last_error());
    }
    Ok(r)
}

impl Drop for LifecycleSubscription {
    fn drop(&mut self) {
        for id in &self.ids {
            // SAFETY: `self.conn` keeps the connection alive; each id came from a successful
            // registration on it and is deregistered once (libvirt then frees its data).
            unsafe {
                sys::virConnectDomainEventDeregisterAny(self.conn.as_ptr(), *id);
            }
        }
        if let Some(id) = self.qemu_stop {
            // SAFETY: as above, for the QMP event registration.
            unsafe {
                sys::virConnectDomainQemuMonitorEventDeregister(self.conn.as_ptr(), id);
            }
        }
    }
}

/// Abort the domain's current job (a migration): `virDomainAbortJob`.
pub fn abort_job(dom: &Domain) -> Result<(), virt::error::Error> {
    // SAFETY: `dom` is a live domain handle for the duration of the call.
    let r = unsafe { sys::virDomainAbortJob(dom.as_ptr()) };
    if r < 0 {
        return Err(virt::error::Error::last_error());
    }
    Ok(())
}

/// Switch a running migration (started with `VIR_MIGRATE_POSTCOPY`) to post-copy:
/// `virDomainMigrateStartPostCopy`.
pub fn start_post_copy(dom: &Domain) -> Result<(), virt::error::Error> {
    // SAFETY: `dom` is a live domain handle for the duration of the call.
    let r = unsafe { sys::virDomainMigrateStartPostCopy(dom.as_ptr(), 0) };
    if r < 0 {
        return Err(virt::error::Error::last_error());
    }
    Ok(())
}

// _IOW('T', 202, int) and _IOW('T', 203, int) from <linux/if_tun.h>
const TUNSETIFF: c_ulong = 0x4004_54ca;
const TUNSETPERSIST: c_ulong = 0x4004_54cb;

/// Create the persistent kernel tap `name` (`IFF_TAP | IFF_NO_PI`, like `ip tuntap add mode
/// tap`) in the calling thread's network namespace. Fails with `EBUSY` when a tap of that
/// name is open, `EINVAL`/`EEXIST` when another kind of device has the name.
pub fn create_persistent_tap(name: &str) -> std::io::Result<()> {
    let tun = open_tap(name)?;
    // SAFETY: `tun` is attached to the tap; TUNSETPERSIST takes an integer argument by value.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETPERSIST as _, 1 as c_ulong) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // closing `tun` leaves the persistent tap behind for QEMU to open by name
    Ok(())
}

/// A descriptor attached to the tap `name` (`IFF_TAP | IFF_NO_PI`), as QEMU opens it:
/// created in the calling thread's network namespace if missing, gone with the descriptor
/// unless made persistent.
pub fn open_tap(name: &str) -> std::io::Result<std::fs::File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("tap name {name:?}: 1-15 characters"),
        ));
    }
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: `ifreq` is a plain C struct (integers, arrays and a union of those): the
    // all-zero bit pattern is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as c_short;
    // SAFETY: `tun` is an open /dev/net/tun descriptor; TUNSETIFF reads (and may write back)
    // one `ifreq`, which lives on this stack frame for the whole call.
    if unsafe {
        libc::ioctl(
            tun.as_raw_fd(),
            TUNSETIFF as _,
            &mut ifr as *mut libc::ifreq,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(tun)
}

/// The domain's job statistics (`virDomainGetJobStats`). Replaces `virt` 0.5's
/// `Domain::job_stats`, which builds a `Vec` from libvirt's NULL pointer when there are no
/// stats (no job, or no completed job yet) — undefined behaviour that aborts the process —
/// and hands libvirt's allocation to Rust's allocator.
pub fn job_stats(dom: &Domain, flags: u32) -> Result<virt::domain::JobStats, virt::error::Error> {
    let mut kind: c_int = 0;
    let mut params: sys::virTypedParameterPtr = std::ptr::null_mut();
    let mut nparams: c_int = 0;
    // SAFETY: `dom` is a live domain handle; libvirt writes the job type, allocates `params`
    // (or leaves it NULL) and sets `nparams`, all through pointers to these locals.
    let r = unsafe {
        sys::virDomainGetJobStats(dom.as_ptr(), &mut kind, &mut params, &mut nparams, flags)
    };
    if r < 0 {
        return Err(virt::error::Error::last_error());
    }
    let copied = if params.is_null() || nparams <= 0 {
        Vec::new()
    } else {
        // SAFETY: libvirt returned `nparams` initialized parameters at `params`; they are
        // copied (plain data; string values keep pointing into libvirt's allocation, which
        // is only freed below, after the conversion has copied them).
        unsafe { std::slice::from_raw_parts(params, nparams as usize) }.to_vec()
    };
    let stats = virt::domain::JobStats::from((kind, copied));
    if !params.is_null() {
        // SAFETY: `params`/`nparams` are what libvirt allocated above; freed once, after the
        // last use of the copies' string pointers (in the conversion).
        unsafe { sys::virTypedParamsFree(params, nparams) };
    }
    Ok(stats)
}

static TERMINATED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_terminate(_: c_int) {
    // async-signal-safe: one atomic store
    TERMINATED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// From now on SIGTERM and SIGINT only set a flag, which the returned function reads: for a
/// synchronous loop that must end on its container's stop even as its PID 1 (the kernel
/// delivers no signal to a PID 1 that has not installed a handler for it, so the kubelet
/// would wait out the grace period and kill it).
pub fn stop_on_terminate() -> std::io::Result<fn() -> bool> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler does nothing but an atomic store (async-signal-safe); the
        // sigaction struct is zeroed, then filled, before libc reads it.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_terminate as extern "C" fn(c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(|| TERMINATED.load(std::sync::atomic::Ordering::SeqCst))
}
