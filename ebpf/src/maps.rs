//! The maps, pinned by name by the agent so every program generation and the agent share
//! them. Names must be `linkerd_cni_common::names::MAPS` (the agent fails to load otherwise):
//! the macro takes only literals, so the agent's unit tests check the built object against
//! that list.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_SK_STORAGE_GET_F_CREATE,
    btf_maps::{
        Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap, ProgramArray, SkStorage,
        SockHash,
    },
    helpers::generated::bpf_sk_storage_get,
    macros::btf_map,
};
use linkerd_cni_common::{
    AddrKey, ConnKey, IterArgs, ListenerKey, OrigDst, PodAddrs, PodConfig, PodStats, PortBlock,
    PortSetKey,
    names::{MAX_ADDRS, MAX_CONNS, MAX_PODS, MAX_PORT_BLOCKS},
};

// BTF-defined maps (section `.maps`): the object's BTF carries each key and value type with its
// field names, the kernel records them with the map, and `bpftool map dump` prints named
// fields. The agent pins them (BTF maps have no pinning attribute in aya-ebpf).

#[btf_map(name = "l5d_pod_config")]
pub static POD_CONFIG: HashMap<u64, PodConfig, { MAX_PODS as usize }> = HashMap::new();

#[btf_map(name = "l5d_port_sets")]
pub static PORT_SETS: HashMap<PortSetKey, PortBlock, { MAX_PORT_BLOCKS as usize }> = HashMap::new();

#[btf_map(name = "l5d_addrs")]
pub static ADDRS: LpmTrie<AddrKey, u32, { MAX_ADDRS as usize }> = LpmTrie::new();

#[btf_map(name = "l5d_sock_dst")]
pub static SOCK_DST: LruHashMap<u64, OrigDst, { MAX_CONNS as usize }> = LruHashMap::new();

#[btf_map(name = "l5d_conn_dst")]
pub static CONN_DST: LruHashMap<ConnKey, OrigDst, { MAX_CONNS as usize }> = LruHashMap::new();

#[btf_map(name = "l5d_pod_stats")]
pub static POD_STATS: PerCpuHashMap<u64, PodStats, { MAX_PODS as usize }> = PerCpuHashMap::new();

#[btf_map(name = "l5d_pod_by_ip")]
pub static POD_BY_IP: HashMap<[u32; 4], u64, { MAX_ADDRS as usize }> = HashMap::new();

/// The pod's own address of each family, by netns cookie: what [`crate::getsockname`] shows a
/// redirected app socket as its local address. Written by the agent with the pod's config.
#[btf_map(name = "l5d_pod_addrs")]
pub static POD_ADDRS: HashMap<u64, PodAddrs, { MAX_PODS as usize }> = HashMap::new();

/// SOCKHASH: the kernel takes no key/value BTF for socket maps, so this one stays untyped in
/// `bpftool` (its values are sockets anyway).
#[btf_map(name = "l5d_listeners")]
pub static LISTENERS: SockHash<ListenerKey, { MAX_PODS as usize * 2 }> = SockHash::new();

/// Socket-local storage of the proxy's accepted sockets: the original destination, moved here
/// from [`CONN_DST`] when the handshake completes. Lives and dies with the socket. A BTF map
/// (the kernel takes socket storage only with BTF); the agent pins it by name like the others.
#[btf_map(name = "l5d_acc_dst")]
pub static ACC_DST: SkStorage<OrigDst> = SkStorage::new();

/// Socket-local storage of a redirected app socket: its original destination, saved by
/// [`crate::connect`] and read by [`crate::getpeername`] and [`crate::sockops`] (which hands it to
/// the 4-tuple map when the handshake completes). Lives and dies with the socket: no entry to
/// insert into a shared map, none to delete, no state callback to ask for.
#[btf_map(name = "l5d_app_dst")]
pub static APP_DST: SkStorage<OrigDst> = SkStorage::new();

/// Per-CPU scratch slot 0: the netns cookie of the pod whose `sk_lookup` stub runs, written by
/// the stub right before it tail-calls [`LOOKUP_PROG`]\[0\] on the same CPU.
#[btf_map(name = "l5d_lookup_ns")]
pub static LOOKUP_NS: PerCpuArray<u64, 1> = PerCpuArray::new();

/// Slot 0: the shared `sk_lookup` program every pod's stub tail-calls (set by the agent).
/// No program of this object uses it; the agent's stubs do. A program array takes no BTF.
#[btf_map(name = "l5d_lookup_prog")]
pub static LOOKUP_PROG: ProgramArray<1> = ProgramArray::new();

/// Slot 0: what the agent asks of the next run of [`crate::iter`] (written by the agent right
/// before it creates the iterator; one run at a time).
#[btf_map(name = "l5d_iter_args")]
pub static ITER_ARGS: Array<IterArgs, 1> = Array::new();

/// The original destination saved in `storage` for the socket `sk`, if any.
///
/// # Safety
/// `sk` is a full socket the verifier accepts for `bpf_sk_storage_get` (checked for null).
#[inline(always)]
pub unsafe fn stored_dst(storage: &SkStorage<OrigDst>, sk: *mut c_void) -> Option<OrigDst> {
    // SAFETY: lookup only (no create flag, no initial value).
    let found = unsafe {
        bpf_sk_storage_get(
            core::ptr::from_ref(storage).cast_mut().cast(),
            sk,
            core::ptr::null_mut(),
            0,
        )
    } as *const OrigDst;
    // SAFETY: the storage holds an `OrigDst` and lives as long as the socket.
    (!found.is_null()).then(|| unsafe { *found })
}

/// Saves `dst` in `storage` for the socket `sk` (creating the storage, or overwriting what a
/// previous connect of the same socket saved). False when no storage could be allocated.
///
/// # Safety
/// As for [`stored_dst`].
#[inline(always)]
pub unsafe fn store_dst(storage: &SkStorage<OrigDst>, sk: *mut c_void, dst: &OrigDst) -> bool {
    let mut init = *dst;
    // SAFETY: `init` initialises new storage; an existing one is returned as it is.
    let slot = unsafe {
        bpf_sk_storage_get(
            core::ptr::from_ref(storage).cast_mut().cast(),
            sk,
            core::ptr::from_mut(&mut init).cast(),
            u64::from(BPF_SK_STORAGE_GET_F_CREATE),
        )
    } as *mut OrigDst;
    if slot.is_null() {
        return false;
    }
    // SAFETY: as above; this program is the socket's only writer at this point.
    unsafe { *slot = *dst };
    true
}

/// Bumps one counter of the pod's stats, if the agent created its entry.
#[inline(always)]
pub fn count(netns_cookie: u64, field: impl FnOnce(&mut PodStats) -> &mut u64) {
    if let Some(stats) = POD_STATS.get_ptr_mut(netns_cookie) {
        // SAFETY: per-CPU value, this program is the only writer on this CPU right now.
        let counter = field(unsafe { &mut *stats });
        *counter += 1;
    }
}
