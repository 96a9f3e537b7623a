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
// or enter one in a process with threads, which a Go process always has,
// and a clone of the daemon with CLONE_NEWUSER would copy its page tables.
// The daemon starts `unshare --user --net --ipc --uts -- cat` instead (a
// millisecond of CPU, where a Go process start costs ten): one unshare(2)
// makes the user namespace and the others owned by it, and a byte echoed
// by cat proves it done. The daemon, root in the parent user namespace,
// writes the ID maps, and a thread of its own joins the owned namespaces,
// takes the pod's mapped root as its effective IDs and sets them up as
// above. Once the namespaces are bind-mounted onto files, cat's stdin is
// closed and it exits. The pins keep the namespaces alive with no process
// or thread in them.
package nsmgr
