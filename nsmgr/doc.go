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
// All namespaces of a pod are created by a single clone of a short-lived
// helper: the small pinrt-nshelper binary (nshelper) when it is installed
// next to pinrt, else the daemon's own binary re-executed with
// HelperCommand. The helper also brings up lo, so no CNI loopback plugin
// runs. A Go
// process is multithreaded and can never setns into a user namespace, so
// the daemon itself never switches namespaces here; the helper is born in
// them, applies the pod's sysctls from inside, reports on a pipe and is
// killed once its namespaces are bind-mounted onto files. The pins keep the
// namespaces alive with no process in them.
package nsmgr
