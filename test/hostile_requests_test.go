package test

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestHostileRequests sends RunPodSandbox and CreateContainer requests
// whose fields, picked at random by walking the CRI messages, hold hostile
// values: path escapes, newlines, NULs, huge strings, numbers at their
// limits, enum values no version of the API has, ID mappings that overlap
// or overflow. Every answer must be a success or a refusal with a code
// that says the request was wrong (InvalidArgument and its kin, never
// Unknown or Internal); the daemon must live through all of them; and once
// a refused request returns, or an accepted one is removed, nothing may be
// left: no pin, directory, mount, IP, cgroup or file outside the daemon's
// directories. HOSTILE_ITERATIONS (150) requests of each kind,
// HOSTILE_SEED to replay a run.
func TestHostileRequests(t *testing.T) {
	e := newCtrEnv(t)
	d := e.d
	n := int(envInt("HOSTILE_ITERATIONS", 150))
	seed := envInt("HOSTILE_SEED", time.Now().UnixNano())
	t.Logf("HOSTILE_SEED=%d HOSTILE_ITERATIONS=%d", seed, n)
	h := &hostile{t: t, e: e, rng: rand.New(rand.NewSource(seed)), base: t.TempDir()}
	h.escape = filepath.Join(os.TempDir(), "pinrt-hostile-escape")
	_ = os.RemoveAll(h.escape)
	t.Cleanup(func() { _ = os.RemoveAll(h.escape) })

	podFields := fieldPaths((&runtimeapi.PodSandboxConfig{}).ProtoReflect().Descriptor(), 5)
	for i := range n {
		cfg := PodConfig(fmt.Sprintf("hostile-%d", i))
		cfg.LogDirectory = filepath.Join(d.Dir, "logs", "hostile")
		cfg.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 80}}
		cfg.DnsConfig = &runtimeapi.DNSConfig{Servers: []string{"10.0.0.10"}, Searches: []string{"svc.cluster.local"}, Options: []string{"ndots:5"}}
		what := h.mutate(cfg.ProtoReflect(), podFields)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		resp, err := d.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		cancel()
		h.judge("RunPodSandbox", what, err)
		if err == nil {
			h.removePod(resp.PodSandboxId, what)
		}
		h.checkClean(what)
	}

	ctrFields := fieldPaths((&runtimeapi.ContainerConfig{}).ProtoReflect().Descriptor(), 5)
	for _, userns := range []bool{false, true} {
		podCfg := PodConfig(fmt.Sprintf("hostile-host-%v", userns))
		if userns {
			podCfg = UsernsPod(podCfg, 0)
		}
		pod, podCfg := e.pod(t, podCfg)
		for i := range n / 2 {
			cfg := h.container(fmt.Sprintf("c%d", i))
			what := h.mutate(cfg.ProtoReflect(), ctrFields)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			resp, err := d.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
			cancel()
			h.judge("CreateContainer", what, err)
			if err == nil {
				h.startAndRemove(resp.ContainerId, what)
			}
			h.checkClean(what)
		}
	}
	h.otherCalls(n)
	if !d.Running() {
		t.Fatalf("the daemon died; its log:\n%s", d.Log())
	}
	t.Logf("answers: %v", h.codes)
	removeAllAndCheck(t, d)
}

// hostileCall is one RPC with a valid request to mutate.
type hostileCall struct {
	name string
	req  proto.Message
	call func(context.Context, proto.Message) error
}

func callOf[Req proto.Message, Resp any](name string, req Req, f func(context.Context, Req, ...grpc.CallOption) (Resp, error)) hostileCall {
	return hostileCall{name, req, func(ctx context.Context, m proto.Message) error {
		_, err := f(ctx, m.(Req))
		return err
	}}
}

// otherCalls sends n hostile requests of every other call that names a
// container, a pod or an image, about a running container: each is
// judged as a create is, and the container must still run at the end.
func (h *hostile) otherCalls(n int) {
	t, e := h.t, h.e
	rt, img := e.d.Runtime, e.d.Image
	pod, podCfg := e.pod(t, PodConfig("hostile-calls"))
	id := e.run(t, pod, podCfg, e.ctr("target", "sleep", "1000"))
	res := &runtimeapi.LinuxContainerResources{CpuShares: 512, MemoryLimitInBytes: 128 << 20}
	calls := []hostileCall{
		callOf("ExecSync", &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"true"}, Timeout: 10}, rt.ExecSync),
		callOf("Exec", &runtimeapi.ExecRequest{ContainerId: id, Cmd: []string{"true"}, Stdout: true}, rt.Exec),
		callOf("Attach", &runtimeapi.AttachRequest{ContainerId: id, Stdout: true}, rt.Attach),
		callOf("PortForward", &runtimeapi.PortForwardRequest{PodSandboxId: pod, Port: []int32{80}}, rt.PortForward),
		callOf("UpdateContainerResources", &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: res}, rt.UpdateContainerResources),
		callOf("ReopenContainerLog", &runtimeapi.ReopenContainerLogRequest{ContainerId: id}, rt.ReopenContainerLog),
		callOf("ContainerStatus", &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true}, rt.ContainerStatus),
		callOf("PodSandboxStatus", &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod, Verbose: true}, rt.PodSandboxStatus),
		callOf("ContainerStats", &runtimeapi.ContainerStatsRequest{ContainerId: id}, rt.ContainerStats),
		callOf("PodSandboxStats", &runtimeapi.PodSandboxStatsRequest{PodSandboxId: pod}, rt.PodSandboxStats),
		callOf("ListContainers", &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}}, rt.ListContainers),
		callOf("ListPodSandbox", &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: pod}}, rt.ListPodSandbox),
		callOf("ListContainerStats", &runtimeapi.ListContainerStatsRequest{Filter: &runtimeapi.ContainerStatsFilter{Id: id}}, rt.ListContainerStats),
		callOf("ListPodSandboxStats", &runtimeapi.ListPodSandboxStatsRequest{Filter: &runtimeapi.PodSandboxStatsFilter{Id: pod}}, rt.ListPodSandboxStats),
		callOf("ListPodSandboxMetrics", &runtimeapi.ListPodSandboxMetricsRequest{}, rt.ListPodSandboxMetrics),
		callOf("Status", &runtimeapi.StatusRequest{Verbose: true}, rt.Status),
		callOf("ImageStatus", &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: e.busybox}, Verbose: true}, img.ImageStatus),
		callOf("ListImages", &runtimeapi.ListImagesRequest{Filter: &runtimeapi.ImageFilter{Image: &runtimeapi.ImageSpec{Image: e.busybox}}}, img.ListImages),
	}
	for range n {
		c := calls[h.rng.Intn(len(calls))]
		req := proto.Clone(c.req)
		what := c.name + " with " + h.mutate(req.ProtoReflect(), fieldPaths(req.ProtoReflect().Descriptor(), 5))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := c.call(ctx, req)
		cancel()
		h.judge(c.name, what, err)
	}
	if st := e.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("the container the calls named is %v, want it still running", st.State)
	}
	e.mustExec(t, id, "true")
}

// hostile is one run of TestHostileRequests.
type hostile struct {
	t      *testing.T
	e      *ctrEnv
	rng    *rand.Rand
	base   string // where host paths may point
	escape string // where an escaping path would land
	codes  map[string]int
}

// container is a valid container config with one of most things, for the
// mutations to change.
func (h *hostile) container(name string) *runtimeapi.ContainerConfig {
	cfg := h.e.ctr(name, "sleep", "1000")
	cfg.Args = []string{"-x"}
	cfg.WorkingDir = "/tmp"
	cfg.Envs = []*runtimeapi.KeyValue{{Key: "A", Value: []byte("b")}}
	cfg.Labels = map[string]string{"l": "v"}
	cfg.Annotations = map[string]string{"a": "v"}
	cfg.Mounts = []*runtimeapi.Mount{{HostPath: filepath.Join(h.base, "vol"), ContainerPath: "/vol"}}
	cfg.Devices = []*runtimeapi.Device{{HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "rwm"}}
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{CpuShares: 512, MemoryLimitInBytes: 64 << 20, CpusetCpus: "0"}
	cfg.Linux.SecurityContext.Capabilities = &runtimeapi.Capability{AddCapabilities: []string{"CAP_NET_RAW"}, DropCapabilities: []string{"CAP_CHOWN"}}
	cfg.Linux.SecurityContext.RunAsUser = &runtimeapi.Int64Value{Value: 0}
	cfg.Linux.SecurityContext.MaskedPaths = []string{"/proc/kcore"}
	return cfg
}

// fieldPath is the way from a message to one of its fields, through
// singular messages and (as a new element) repeated ones.
type fieldPath []protoreflect.FieldDescriptor

func (p fieldPath) String() string {
	names := make([]string, len(p))
	for i, fd := range p {
		names[i] = string(fd.Name())
	}
	return strings.Join(names, ".")
}

// unsafeFields are left alone, because a value the daemon wrongly accepted
// would reach the host itself: sysctls a pod without its own namespace
// writes on the host, Windows settings no Linux runtime reads.
var unsafeFields = map[protoreflect.Name]bool{"sysctls": true, "windows": true}

// fieldPaths lists every field under md, to depth levels of messages.
func fieldPaths(md protoreflect.MessageDescriptor, depth int) []fieldPath {
	var out []fieldPath
	var walk func(md protoreflect.MessageDescriptor, prefix fieldPath, depth int)
	walk = func(md protoreflect.MessageDescriptor, prefix fieldPath, depth int) {
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if unsafeFields[fd.Name()] {
				continue
			}
			p := append(append(fieldPath{}, prefix...), fd)
			if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() {
				if depth > 0 {
					walk(fd.Message(), p, depth-1)
				}
				continue
			}
			out = append(out, p)
		}
	}
	walk(md, nil, depth)
	return out
}

// mutate sets one to three random fields of m to hostile values and says
// which, for the failure messages.
func (h *hostile) mutate(m protoreflect.Message, paths []fieldPath) string {
	if len(paths) == 0 {
		return "no fields"
	}
	var what []string
	for range 1 + h.rng.Intn(3) {
		p := paths[h.rng.Intn(len(paths))]
		msg := m
		for _, fd := range p[:len(p)-1] {
			if fd.IsList() {
				// An element the valid request has, or a new one.
				l := msg.Mutable(fd).List()
				if l.Len() > 0 && h.rng.Intn(2) == 0 {
					msg = l.Get(h.rng.Intn(l.Len())).Message()
					continue
				}
				el := l.NewElement()
				l.Append(el)
				msg = el.Message()
				continue
			}
			msg = msg.Mutable(fd).Message()
		}
		leaf := p[len(p)-1]
		what = append(what, fmt.Sprintf("%s=%s", p, h.set(msg, leaf)))
	}
	return strings.Join(what, " ")
}

// set gives m's field fd a hostile value and returns it, quoted.
func (h *hostile) set(m protoreflect.Message, fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		k, v := h.scalar(fd.MapKey()), h.scalar(fd.MapValue())
		m.Mutable(fd).Map().Set(k.MapKey(), v)
		return fmt.Sprintf("{%s: %s}", quote(k), quote(v))
	case fd.IsList():
		l := m.Mutable(fd).List()
		v := h.scalar(fd)
		l.Append(v)
		return fmt.Sprintf("[..., %s]", quote(v))
	default:
		v := h.scalar(fd)
		m.Set(fd, v)
		return quote(v)
	}
}

// quote shows a value in a failure message, a string shortened.
func quote(v protoreflect.Value) string {
	s, ok := v.Interface().(string)
	if !ok {
		return fmt.Sprint(v.Interface())
	}
	if len(s) > 80 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// scalar is a hostile value of fd's kind.
func (h *hostile) scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	pick := func(vs ...int64) int64 { return vs[h.rng.Intn(len(vs))] }
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(h.str(fd.Name()))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(h.rng.Intn(2) == 0)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		if h.rng.Intn(3) == 0 {
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(pick(-1, 99, math.MaxInt32)))
		}
		return protoreflect.ValueOfEnum(vals.Get(h.rng.Intn(vals.Len())).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(pick(-1, 0, 1, math.MaxInt32, math.MinInt32, 65535, 65536)))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(pick(-1, 0, 1, 2, math.MaxInt64, math.MinInt64, 1<<32, 1<<40, 4096))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(pick(0, 1, 65535, 65536, 1<<31, math.MaxUint32, 1000)))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(pick(0, 1, math.MaxInt64, 1<<32)) | uint64(pick(0, 0, 1))<<63)
	case protoreflect.BytesKind:
		b := make([]byte, h.rng.Intn(64))
		h.rng.Read(b)
		return protoreflect.ValueOfBytes(b)
	case protoreflect.DoubleKind, protoreflect.FloatKind:
		return protoreflect.ValueOfFloat64(math.Inf(1))
	}
	panic(fmt.Sprintf("no hostile value for %v", fd.Kind()))
}

// str is a hostile string for a field named name. Fields that name a host
// path get one under h.base or one that escapes it towards h.escape, so an
// accepted one creates nothing outside the test's directories.
func (h *hostile) str(name protoreflect.Name) string {
	escape := "../../../../../../../../.." + h.escape
	common := []string{
		"", " ", ".", "..", "a/../../b", "a\nb", "a\x00b", "a\rb\tc",
		strings.Repeat("a", 5000), strings.Repeat("x/", 2100), "-rf",
		"$(touch " + h.escape + ")", "ü\u202e", "*", ":", "a=b", "=", "%n%s",
		"localhost/" + escape, escape,
	}
	switch name {
	case "host_path", "log_directory":
		// kubelet may name any host path, and a missing one is made: only
		// relative ones may not leave h.base.
		return pickStr(h.rng, filepath.Join(h.base, "x/../y"), h.base+"/"+pickStr(h.rng, common[:len(common)-2]...),
			"relative/dir", "")
	case "path":
		// Devices' host paths: only /dev's harmless ones, or none at all.
		return pickStr(h.rng, "/dev/null", "/dev/../dev/zero", "/dev/nonexistent", "relative", "", "/dev/null\n")
	}
	return pickStr(h.rng, common...)
}

func pickStr(rng *rand.Rand, vs ...string) string { return vs[rng.Intn(len(vs))] }

// judge fails the test for an answer that is neither a success nor a
// refusal of the request.
func (h *hostile) judge(op, what string, err error) {
	h.t.Helper()
	if h.codes == nil {
		h.codes = map[string]int{}
	}
	h.codes[op+" "+status.Code(err).String()]++
	switch status.Code(err) {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists,
		codes.FailedPrecondition, codes.OutOfRange, codes.ResourceExhausted, codes.Unimplemented:
	default:
		h.t.Errorf("%s with %s: %v, want success or a refusal of the request", op, what, err)
	}
	if !h.e.d.Running() {
		h.t.Fatalf("the daemon died after %s with %s; its log:\n%s", op, what, h.e.d.Log())
	}
}

func (h *hostile) removePod(id, what string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := h.e.d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		h.t.Errorf("RemovePodSandbox of the pod with %s: %v", what, err)
	}
	if left := podCgroupDirs(id); len(left) > 0 {
		h.t.Errorf("the pod with %s left cgroups %v", what, left)
	}
}

// startAndRemove starts an accepted container and removes it. The start
// is judged as the create is: the command (sleep) exists whatever the
// mutations appended to it, so a start that fails for anything but a
// refusal means the create accepted what the runtime cannot run.
func (h *hostile) startAndRemove(id, what string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := h.e.d.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	h.judge("StartContainer", what, err)
	if _, err := h.e.d.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		h.t.Errorf("RemoveContainer of the container with %s: %v", what, err)
	}
}

// checkClean fails the test for anything of a pod or container that is
// gone, or of a refused request: pins, directories, mounts, IPs, files
// named by an ID, and whatever reached the escape path.
func (h *hostile) checkClean(what string) {
	h.t.Helper()
	d := h.e.d
	var left []string
	ctx := Ctx(h.t)
	pods, err := d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		h.t.Fatalf("ListPodSandbox after %s: %v", what, err)
	}
	keep := map[string]bool{}
	for _, p := range pods.Items {
		keep[p.Id] = true
	}
	ctrs, err := d.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		h.t.Fatalf("ListContainers after %s: %v", what, err)
	}
	if len(ctrs.Containers) > 0 {
		left = append(left, fmt.Sprintf("%d containers", len(ctrs.Containers)))
	}
	for _, l := range d.Leftovers() {
		if !keep[filepath.Base(strings.Fields(l)[1])] && !strings.HasPrefix(l, "mount ") {
			left = append(left, l)
		}
	}
	for _, m := range MountsUnder(d.Dir) {
		if !strings.Contains(m, "/ns/") && !strings.Contains(m, "/sandboxes/") {
			left = append(left, "mount "+m)
		}
	}
	for _, dir := range []string{filepath.Join(d.Root, "containers"), filepath.Join(d.RunRoot, "exits")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !keep[e.Name()] {
				left = append(left, filepath.Join(dir, e.Name()))
			}
		}
	}
	if ips := len(d.LeasedIPs(h.t)); ips > len(keep) {
		left = append(left, fmt.Sprintf("%d IPs leased for %d pods", ips, len(keep)))
	}
	if _, err := os.Lstat(h.escape); err == nil {
		left = append(left, h.escape)
		_ = os.RemoveAll(h.escape)
	}
	_ = filepath.WalkDir(h.base, func(p string, de fs.DirEntry, err error) error {
		if err == nil && p != h.base {
			_ = os.RemoveAll(p)
			return fs.SkipDir
		}
		return nil
	})
	if len(left) > 0 {
		h.t.Errorf("after %s, left behind:\n%s", what, strings.Join(left, "\n"))
	}
}
