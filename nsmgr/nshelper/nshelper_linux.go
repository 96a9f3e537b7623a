package nshelper

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"unsafe"
)

// Main is the body of the re-executed helper. It is born in the
// pod's new namespaces (the parent's clone flags put it there), sets the
// hostname of its UTS namespace when asked, writes each "path=value"
// sysctl argument under /proc/sys, which resolves to its own namespaces,
// reports on fd 3 and then waits for the parent to close its stdin or
// kill it. It does nothing else, to stay cheap.
func Main(args []string) int {
	status := os.NewFile(3, "status")
	err := error(nil)
	if len(args) > 0 && args[0] == LoArg {
		err = loopbackUp()
		args = args[1:]
	}
	if err == nil && len(args) > 0 && strings.HasPrefix(args[0], HostnameArg) {
		if err = syscall.Sethostname([]byte(strings.TrimPrefix(args[0], HostnameArg))); err != nil {
			err = fmt.Errorf("sethostname: %w", err)
		}
		args = args[1:]
	}
	if err == nil {
		err = applySysctls(args)
	}
	if err != nil {
		verb := "error"
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ERANGE) {
			verb = "invalid"
		}
		fmt.Fprintf(status, "%s %v\n", verb, err)
		return 1
	}
	if _, err := status.Write([]byte("ok\n")); err != nil {
		return 1
	}
	status.Close()
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// loopbackUp sets IFF_UP on lo of the helper's network namespace, with
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
		// The parent validated the names; this guards the file system
		// against a helper started by hand.
		if !ok || CheckSysctlPath(path) != nil {
			return fmt.Errorf("bad sysctl argument %q: %w", a, syscall.EINVAL)
		}
		f, err := os.OpenFile("/proc/sys/"+path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("sysctl %s: %w", SwapSeparators(path), err)
		}
		_, err = f.WriteString(value)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("sysctl %s=%q: %w", SwapSeparators(path), value, err)
		}
	}
	return nil
}
