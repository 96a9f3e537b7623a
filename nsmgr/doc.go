// Package nsmgr creates a pod's namespaces, pins them to files, reopens the
// pins after a daemon restart and removes them. It also hands out the
// 65536-ID host ranges that back pod user namespaces, and keeps the ranges
// callers choose (any kernel-valid length) from overlapping them.
//
// When a pod has a user namespace, its net, IPC and UTS namespaces are
// created inside it, so the kernel records the pod's userns as their owner.
// That is what lets an OCI runtime that joins the pod's userns mount a fresh
// sysfs: the kernel allows a sysfs mount only to a task that is privileged
// over the user namespace owning its network namespace.
//
// Without a user namespace, a pod's net, IPC and UTS namespaces are
// unshared by an OS thread of the daemon, locked to its goroutine, which
// brings up lo (so no CNI loopback plugin runs), sets the hostname and
// sysctls, and ends with its goroutine once the namespaces are pinned: no
// process is started.
//
// A user namespace cannot be made that way: the kernel refuses to unshare
// or enter one in a process with threads, which a Go process always has.
// The daemon starts a short-lived helper instead, the small pinrt-nshelper
// binary (nshelper) when it is installed next to pinrt, else the daemon's
// own binary re-executed with HelperCommand. It is started plainly, on Go's
// cheap vfork path, and clones itself into all the pod's namespaces at
// once (a clone with CLONE_NEWUSER copies the parent's page tables, cheap
// for the helper, not for the daemon). The clone applies the sysctls from
// inside and reports on a pipe; both exit once the namespaces are
// bind-mounted onto files. The pins keep the namespaces alive with no
// process or thread in them.
package nsmgr
