//! The host facts registration depends on, read from the kernel and the filesystem: a pod's
//! network namespace ([`netns`]) and cgroup ([`cgroup`]), its user namespace's view of the
//! proxy's IDs ([`userns`]), a running pod as the host sees it ([`podscan`]), the runtime's
//! network namespaces by address ([`podnetns`]), what the kernel offers ([`kernel`]), how it
//! lays out the structures the iterator reads ([`btf`]), which capabilities this process
//! holds ([`capabilities`]), which directories are ours ([`owned`]), a namespace's addresses
//! from a route netlink socket made inside it ([`rtnl`]) and whether a pod's namespace carries
//! Linkerd's iptables rules ([`natrules`]).
//!
//! Nothing here knows about pods' redirection state: the layers above ([`crate::agent`],
//! [`crate::dataplane`]) call down into it, never the other way.

pub mod btf;
pub mod capabilities;
pub mod cgroup;
pub mod kernel;
pub mod natrules;
pub mod netns;
pub mod owned;
pub mod peer;
pub mod podnetns;
pub mod podscan;
pub mod rtnl;
pub mod userns;
