package cgroups

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	systemddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// jobTimeout bounds the wait for one systemd job (start or stop a unit);
// systemd runs them in order with everything else, so a busy manager is
// slow, but never this slow.
const jobTimeout = 30 * time.Second

// unitManager is the part of systemd's D-Bus API the driver uses; tests
// use a fake.
type unitManager interface {
	StartTransientUnitContext(ctx context.Context, name, mode string, props []systemddbus.Property, ch chan<- string) (int, error)
	StopUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error)
	Close()
}

// systemdDriver gives each pod a slice and each container a scope, both
// owned by systemd: a second writer to the hierarchy systemd manages
// would have its settings reset whenever systemd reloads. The slices are
// created here over D-Bus; the scopes by runc (--systemd-cgroup) from the
// cgroupsPath "slice:pinrt:id".
type systemdDriver struct {
	parent string // the default slice, e.g. pinrt.slice

	mu   sync.Mutex
	conn unitManager
	dial func(context.Context) (unitManager, error)
}

var _ Driver = (*systemdDriver)(nil)

func newSystemd(parent string) *systemdDriver {
	return &systemdDriver{parent: parent, dial: func(ctx context.Context) (unitManager, error) {
		return systemddbus.NewWithContext(ctx)
	}}
}

func (*systemdDriver) Name() string { return DriverSystemd }

// PodParent is kubelet's slice, or <default-prefix>-<sandbox>.slice, which
// systemd's naming places inside the default slice. kubelet's systemd
// cgroup driver sends its slice as the path systemd gives it
// ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice",
// kubelet's CgroupName.ToSystemd); crictl sends the unit name,
// and critest a top-level slice's path ("/test.slice"). All mean the unit,
// which is what is returned; a path that is not the slice's own is refused.
func (d *systemdDriver) PodParent(kubeletParent, sandboxID string) (string, error) {
	if kubeletParent != "" {
		slice := kubeletParent
		if strings.HasPrefix(slice, "/") {
			if dir, ok := expandSlice(path.Base(slice)); ok && dir == slice {
				slice = path.Base(slice)
			}
		}
		if !IsSlice(slice) {
			return "", fmt.Errorf("cgroup parent %q is not a systemd slice (the systemd cgroup driver needs one, like kubepods-burstable-pod<uid>.slice or its path /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice): %w", kubeletParent, errdefs.ErrInvalidArgument)
		}
		return slice, nil
	}
	prefix := strings.TrimSuffix(d.parent, ".slice")
	if prefix == "-" {
		return sandboxID + ".slice", nil
	}
	return prefix + "-" + sandboxID + ".slice", nil
}

// EnsurePod starts the pod's slice as a transient unit. A slice that
// exists already (kubelet made it, or an earlier container) is fine.
func (d *systemdDriver) EnsurePod(ctx context.Context, slice string) error {
	props := []systemddbus.Property{
		systemddbus.PropDescription("pinrt pod slice " + slice),
		// Accounting turns the controllers on down to the pod, so the
		// containers' scopes can be limited.
		{Name: "MemoryAccounting", Value: godbus.MakeVariant(true)},
		{Name: "CPUAccounting", Value: godbus.MakeVariant(true)},
		{Name: "TasksAccounting", Value: godbus.MakeVariant(true)},
		{Name: "IOAccounting", Value: godbus.MakeVariant(true)},
	}
	err := d.job(ctx, "start "+slice, func(c unitManager, ch chan<- string) (int, error) {
		return c.StartTransientUnitContext(ctx, slice, "replace", props, ch)
	})
	if dbusErrorName(err) == "org.freedesktop.systemd1.UnitExists" {
		return nil
	}
	return err
}

func (*systemdDriver) ContainerPath(parent, id string) string { return parent + ":pinrt:" + id }

func (*systemdDriver) RuntimeArgs() []string { return []string{"--systemd-cgroup"} }

// FSPath places a slice ("a-b.slice") or runc's "slice:prefix:name" in
// the hierarchy as systemd does: a slice sits inside the slices its
// dash-separated prefixes name (/a.slice/a-b.slice), and a container is
// the scope <prefix>-<name>.scope in its slice.
func (*systemdDriver) FSPath(p string) string {
	slice, unit := p, ""
	if parts := strings.Split(p, ":"); len(parts) == 3 {
		slice, unit = parts[0], parts[1]+"-"+parts[2]+".scope"
		if strings.HasSuffix(parts[2], ".slice") {
			unit = parts[2]
		}
		if strings.ContainsAny(unit, "/") || strings.Contains(unit, "..") {
			return ""
		}
	} else if len(parts) != 1 {
		return ""
	}
	dir, ok := expandSlice(slice)
	if !ok {
		return ""
	}
	return path.Join(dir, unit)
}

// expandSlice is the directory of a slice unit: "-.slice" is the root,
// "a-b.slice" is /a.slice/a-b.slice.
func expandSlice(slice string) (string, bool) {
	if slice == "-.slice" {
		return "/", true
	}
	if !IsSlice(slice) {
		return "", false
	}
	var dir, acc strings.Builder
	for i, part := range strings.Split(strings.TrimSuffix(slice, ".slice"), "-") {
		if i > 0 {
			acc.WriteByte('-')
		}
		acc.WriteString(part)
		dir.WriteString("/" + acc.String() + ".slice")
	}
	return dir.String(), true
}

// RemovePod stops the slice pinrt started for the pod; stopping a slice
// removes its cgroup. A kubelet slice is kubelet's.
func (d *systemdDriver) RemovePod(ctx context.Context, kubeletParent, sandboxID string) error {
	if kubeletParent != "" {
		return nil
	}
	slice, err := d.PodParent("", sandboxID)
	if err != nil {
		return err
	}
	err = d.job(ctx, "stop "+slice, func(c unitManager, ch chan<- string) (int, error) {
		return c.StopUnitContext(ctx, slice, "replace", ch)
	})
	switch dbusErrorName(err) {
	case "org.freedesktop.systemd1.NoSuchUnit", "org.freedesktop.DBus.Error.UnknownObject":
		return nil
	}
	return err
}

// job runs one systemd job and waits, bounded, for its result. A call
// that fails other than with a D-Bus error reply (systemd or dbus
// restarted, the socket closed) drops the connection and is tried once
// more on a fresh one.
func (d *systemdDriver) job(ctx context.Context, what string, call func(unitManager, chan<- string) (int, error)) error {
	ch := make(chan string, 1)
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var conn unitManager
		if conn, err = d.connect(ctx); err != nil {
			return fmt.Errorf("connecting to systemd: %w: %w", err, errdefs.ErrUnavailable)
		}
		if _, err = call(conn, ch); err == nil {
			break
		}
		if dbusErrorName(err) != "" {
			return fmt.Errorf("systemd %s: %w", what, err)
		}
		d.drop(conn)
	}
	if err != nil {
		return fmt.Errorf("systemd %s: %w", what, err)
	}
	t := time.NewTimer(jobTimeout)
	defer t.Stop()
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("systemd %s: job %s", what, res)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("systemd %s: no result within %v: %w", what, jobTimeout, context.DeadlineExceeded)
	case <-ctx.Done():
		return fmt.Errorf("systemd %s: %w", what, ctx.Err())
	}
}

// connect returns the shared connection, dialling it when there is none.
// It is dialled without the caller's deadline: godbus closes a connection
// when the context it was made with ends, and this one outlives the
// request that happened to open it.
func (d *systemdDriver) connect(ctx context.Context) (unitManager, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil {
		c, err := d.dial(context.WithoutCancel(ctx))
		if err != nil {
			return nil, err
		}
		d.conn = c
	}
	return d.conn, nil
}

func (d *systemdDriver) drop(c unitManager) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == c {
		d.conn = nil
		c.Close()
	}
}

// dbusErrorName is the D-Bus error name of err, "" when err is not a
// D-Bus error reply.
func dbusErrorName(err error) string {
	var v godbus.Error
	if errors.As(err, &v) {
		return v.Name
	}
	var p *godbus.Error
	if errors.As(err, &p) && p != nil {
		return p.Name
	}
	return ""
}
