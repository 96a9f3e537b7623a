// Package oci turns pinrt's container descriptions into OCI runtime specs
// and drives an OCI runtime (runc, crun) through its command line, with
// conmon as the per-container monitor.
//
// Spec generation is a list of small SpecOpt functions applied in order to
// a Generator (see BuildContainerSpec for the order). Every option is pure
// except for the few that read the container's rootfs or the host, and the
// host facts they need (cgroup controllers, LSMs, the OOM floor) are carried
// in a HostInfo value so tests can inject them.
//
// The base is runtime-tools/generate's Linux spec, trimmed by resetBase to
// what every container shares. runtime-tools v0.9.0, its only release,
// does not compile against runtime-spec v1.3.0 (LinuxPids.Limit became a
// pointer), so go.mod pins the upstream commit that does.
//
// The runtime driver is the concrete *Runtime. Consumers declare the
// interface they need; the method set mirrors CRI-O's RuntimeImpl:
//
//	type ContainerRuntime interface {
//		Create(ctx context.Context, o oci.CreateOptions) (int, error)
//		Start(ctx context.Context, id string) error
//		Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
//		Stop(ctx context.Context, id string, sig syscall.Signal, timeout time.Duration) error
//		Delete(ctx context.Context, id string, force bool) error
//		State(ctx context.Context, id string) (*oci.State, error)
//		ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, int32, error)
//		Update(ctx context.Context, id string, res *specs.LinuxResources) error
//		ReopenLog(ctx context.Context, id string) error
//		Features(ctx context.Context) (*oci.Features, error)
//		CheckIDMap(ctx context.Context) error
//	}
//
// ocitest.Runtime is a hand-written fake with that method set.
package oci
