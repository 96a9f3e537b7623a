package nsmgr

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"
)

// The arguments of setup. Sysctl arguments are "path=value" with a path
// of [a-zA-Z0-9_/.-], so they never collide with these.
const (
	hostnameArg = "--hostname="
	loArg       = "--lo-up" // the thread is in a new network namespace
)

// setup prepares the namespaces of the calling thread as args ask
// ([loArg] [hostnameArg<name>] [path=value...]): it brings up lo, sets the
// hostname and writes each sysctl under /proc/sys, which resolves to the
// thread's own namespaces.
func setup(args []string) error {
	if len(args) > 0 && args[0] == loArg {
		if err := loopbackUp(); err != nil {
			return err
		}
		args = args[1:]
	}
	if len(args) > 0 && strings.HasPrefix(args[0], hostnameArg) {
		if err := syscall.Sethostname([]byte(strings.TrimPrefix(args[0], hostnameArg))); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
		args = args[1:]
	}
	return applySysctls(args)
}

// invalidSetup reports whether a setup error is the kernel refusing a value
// the pod asked for (no such sysctl, a value out of range) rather than a
// failure of the node.
func invalidSetup(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ERANGE)
}

// loopbackUp sets IFF_UP on lo of the thread's network namespace, with
// the SIOCSIFFLAGS ioctl a CNI loopback plugin would otherwise make from a
// process of its own.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up lo: socket: %w", err)
	}
	defer func() { _ = syscall.Close(fd) }()
	var req ifreqFlags
	copy(req.name[:], "lo")
	if err := ioctl(fd, syscall.SIOCGIFFLAGS, &req); err != nil {
		return fmt.Errorf("bring up lo: get flags: %w", err)
	}
	req.flags |= syscall.IFF_UP
	if err := ioctl(fd, syscall.SIOCSIFFLAGS, &req); err != nil {
		return fmt.Errorf("bring up lo: set flags: %w", err)
	}
	return nil
}

// ifreqFlags is struct ifreq with the ifr_flags member of its union.
type ifreqFlags struct {
	name  [syscall.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

func ioctl(fd int, req uintptr, arg *ifreqFlags) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(arg))); errno != 0 {
		return errno
	}
	return nil
}

func applySysctls(args []string) error {
	for _, a := range args {
		path, value, ok := strings.Cut(a, "=")
		// ValidateSysctls checked the names; this keeps a bad path
		// from ever reaching the file system.
		if !ok || checkSysctlPath(path) != nil {
			return fmt.Errorf("bad sysctl argument %q: %w", a, syscall.EINVAL)
		}
		f, err := os.OpenFile("/proc/sys/"+path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("sysctl %s: %w", swapSeparators(path), err)
		}
		_, err = f.WriteString(value)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("sysctl %s=%q: %w", swapSeparators(path), value, err)
		}
	}
	return nil
}
