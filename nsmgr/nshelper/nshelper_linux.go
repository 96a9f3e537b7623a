package nshelper

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// Main is the body of the re-executed helper. It is born in the
// pod's new namespaces (the parent's clone flags put it there), applies
// Setup, reports on fd 3 and then waits for the parent to close its stdin
// or kill it. It does nothing else, to stay cheap. With UserNSArg first,
// it creates the pod's namespaces itself (userNSMain).
func Main(args []string) int {
	if len(args) > 0 && strings.HasPrefix(args[0], UserNSArg) {
		return userNSMain(args)
	}
	status := os.NewFile(3, "status")
	if err := Setup(args); err != nil {
		verb := "error"
		if Invalid(err) {
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

// Setup prepares the namespaces of the calling thread as args ask
// ([LoArg] [HostnameArg<name>] [path=value...]): it brings up lo, sets the
// hostname and writes each sysctl under /proc/sys, which resolves to the
// thread's own namespaces.
func Setup(args []string) error {
	if len(args) > 0 && args[0] == LoArg {
		if err := loopbackUp(); err != nil {
			return err
		}
		args = args[1:]
	}
	if len(args) > 0 && strings.HasPrefix(args[0], HostnameArg) {
		if err := syscall.Sethostname([]byte(strings.TrimPrefix(args[0], HostnameArg))); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
		args = args[1:]
	}
	return applySysctls(args)
}

// Invalid reports whether a Setup error is the kernel refusing a value
// the pod asked for (no such sysctl, a value out of range) rather than a
// failure of the node.
func Invalid(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ERANGE)
}

// userNSMain creates the pod's user namespace, and the namespaces listed
// in UserNSArg inside it, by cloning this helper into them, and the clone
// re-executes the helper as the plain one (Main) with the other arguments.
// The daemon could make that clone itself, but a clone with CLONE_NEWUSER
// cannot take Go's vfork path: made from the daemon, it copies the page
// tables of the whole daemon, and the daemon then takes a fault on every
// page it writes. The helper is small, so it is cheap to copy, and the
// daemon starts it with vfork. (Unsharing the user namespace in place is
// not possible: the kernel refuses it to a process with threads, and a
// Go process always has them.) The clone's report is passed on with its
// PID, whose /proc/<pid>/ns the daemon pins: "ok <pid>".
func userNSMain(args []string) int {
	status := os.NewFile(3, "status")
	fail := func(err error) int {
		fmt.Fprintf(status, "error %v\n", err)
		return 1
	}
	attr, rest, err := parseUserNS(args)
	if err != nil {
		return fail(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	// Pdeathsig fires when the forking thread exits: keep it for good, so
	// that the clone dies with this process and nothing outlives a kill.
	runtime.LockOSThread()
	// /proc/self/exe: the clone, already the pod's mapped root, may not
	// be allowed to search the directories on the way to this binary.
	pid, err := syscall.ForkExec("/proc/self/exe", append([]string{os.Args[0], Command}, rest...), &syscall.ProcAttr{
		Env:   []string{},
		Files: []uintptr{0, 1, 2, w.Fd()},
		Sys:   attr,
	})
	w.Close()
	if err != nil {
		return fail(fmt.Errorf("clone into the new namespaces: %w", err))
	}
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	r.Close()
	if string(msg) == "ok\n" {
		fmt.Fprintf(status, "ok %d\n", pid)
		status.Close()
	}
	// It exits when the daemon closes our shared stdin.
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case string(msg) == "ok\n":
		return 0
	case len(msg) > 0:
		_, _ = status.Write(msg)
		return 1
	}
	return fail(fmt.Errorf("helper in the new namespaces exited before reporting (%s)", waitString(ws, err)))
}

func waitString(ws syscall.WaitStatus, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case ws.Signaled():
		return "signal " + ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(ws.ExitStatus())
}

// parseUserNS reads UserNSArg, UIDMapArg and GIDMapArg off the front of
// args into the clone's attributes and returns the remaining arguments.
func parseUserNS(args []string) (*syscall.SysProcAttr, []string, error) {
	if len(args) < 3 || !strings.HasPrefix(args[1], UIDMapArg) || !strings.HasPrefix(args[2], GIDMapArg) {
		return nil, nil, errors.New("usage: " + UserNSArg + "KINDS " + UIDMapArg + "MAP " + GIDMapArg + "MAP [SETUP ARGS]")
	}
	flags := uintptr(syscall.CLONE_NEWUSER)
	if kinds := strings.TrimPrefix(args[0], UserNSArg); kinds != "" {
		for k := range strings.SplitSeq(kinds, ",") {
			f, ok := map[string]uintptr{"net": syscall.CLONE_NEWNET, "ipc": syscall.CLONE_NEWIPC, "uts": syscall.CLONE_NEWUTS}[k]
			if !ok {
				return nil, nil, errors.New("unknown namespace kind " + strconv.Quote(k))
			}
			flags |= f
		}
	}
	uids, err := ParseIDMap(strings.TrimPrefix(args[1], UIDMapArg))
	if err != nil {
		return nil, nil, err
	}
	gids, err := ParseIDMap(strings.TrimPrefix(args[2], GIDMapArg))
	if err != nil {
		return nil, nil, err
	}
	return &syscall.SysProcAttr{
		Cloneflags: flags,
		// Go writes the maps before the clone goes on, so its setuid(0)
		// already means the pod's mapped root, which may write the
		// sysctls of the namespaces its user namespace owns.
		UidMappings:                uids,
		GidMappings:                gids,
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		Pdeathsig:                  syscall.SIGKILL,
	}, args[3:], nil
}

// FormatIDMap writes ID mappings the way ParseIDMap reads them:
// "container:host:size" joined by commas.
func FormatIDMap(ms []syscall.SysProcIDMap) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = strconv.Itoa(m.ContainerID) + ":" + strconv.Itoa(m.HostID) + ":" + strconv.Itoa(m.Size)
	}
	return strings.Join(parts, ",")
}

// ParseIDMap reads what FormatIDMap writes.
func ParseIDMap(s string) ([]syscall.SysProcIDMap, error) {
	var out []syscall.SysProcIDMap
	for part := range strings.SplitSeq(s, ",") {
		f := strings.Split(part, ":")
		if len(f) != 3 {
			return nil, errors.New("bad ID mapping " + strconv.Quote(part))
		}
		var n [3]int
		for i, v := range f {
			x, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, errors.New("bad ID mapping " + strconv.Quote(part))
			}
			n[i] = int(x)
		}
		out = append(out, syscall.SysProcIDMap{ContainerID: n[0], HostID: n[1], Size: n[2]})
	}
	return out, nil
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
