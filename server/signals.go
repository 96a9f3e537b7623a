package server

import (
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The real-time signals as Docker, containerd and kubelet number them:
// glibc keeps 32 and 33 for itself, so SIGRTMIN is 34 and SIGRTMAX 64.
const (
	sigRTMin = 34
	sigRTMax = 64
)

// stopSignal parses a stop signal: an image's STOPSIGNAL ("SIGUSR1",
// "USR1", "10", "SIGRTMIN+3", the one systemd images give) or the name
// kubelet's stop signal was recorded under. "" is SIGTERM.
func stopSignal(v string) (syscall.Signal, error) {
	if v == "" {
		return syscall.SIGTERM, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 && n <= sigRTMax {
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig, ok := rtSignal(name); ok {
		return sig, nil
	}
	if alias, ok := signalAliases[name]; ok {
		name = alias
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalid("unknown stop signal %q", v)
}

// signalAliases are the second names of three signals, which CRI has
// and x/sys does not.
var signalAliases = map[string]string{"SIGCLD": "SIGCHLD", "SIGIOT": "SIGABRT", "SIGPOLL": "SIGIO"}

// rtSignal parses SIGRTMIN, SIGRTMIN+n, SIGRTMAX and SIGRTMAX-n.
func rtSignal(name string) (syscall.Signal, bool) {
	for _, base := range []struct {
		prefix string
		sig    int
		dir    int
	}{{"SIGRTMIN", sigRTMin, 1}, {"SIGRTMAX", sigRTMax, -1}} {
		rest, ok := strings.CutPrefix(name, base.prefix)
		if !ok {
			continue
		}
		if rest == "" {
			return syscall.Signal(base.sig), true
		}
		sign := "+"
		if base.dir < 0 {
			sign = "-"
		}
		digits, ok := strings.CutPrefix(rest, sign)
		n, err := strconv.Atoi(digits)
		if !ok || err != nil || n < 0 || n > sigRTMax-sigRTMin || digits != strconv.Itoa(n) {
			return 0, false
		}
		return syscall.Signal(base.sig + base.dir*n), true
	}
	return 0, false
}

// criSignalName is the signal name of a CRI stop signal, as kubelet
// sends it when the pod sets lifecycle.stopSignal ("SIGNAL_SIGRTMIN_PLUS3"
// is "SIGRTMIN+3"); "" for RUNTIME_DEFAULT, which leaves the image's.
func criSignalName(s runtimeapi.Signal) (string, error) {
	if s == runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT {
		return "", nil
	}
	enum, ok := runtimeapi.Signal_name[int32(s)]
	if !ok {
		return "", invalid("unknown stop signal %d", s)
	}
	name := strings.TrimPrefix(enum, "SIGNAL_")
	name = strings.Replace(name, "PLUS", "+", 1)
	name = strings.Replace(name, "MINUS", "-", 1)
	if _, err := stopSignal(name); err != nil {
		return "", err
	}
	return name, nil
}

// criSignal is the CRI form of a recorded stop signal, for
// ContainerStatus: under the name it was given when CRI has that name
// (SIGIOT stays SIGIOT), else under its number's; SIGTERM when none was
// set, since the container is stopped with it. RUNTIME_DEFAULT only for
// what is no signal.
func criSignal(v string) runtimeapi.Signal {
	sig, err := stopSignal(v)
	if err != nil {
		return runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT
	}
	given := strings.ToUpper(v)
	if !strings.HasPrefix(given, "SIG") {
		given = "SIG" + given
	}
	for _, name := range []string{given, signalName(sig)} {
		enum := strings.Replace(strings.Replace(name, "+", "PLUS", 1), "-", "MINUS", 1)
		if n, ok := runtimeapi.Signal_value["SIGNAL_"+enum]; ok {
			return runtimeapi.Signal(n)
		}
	}
	return runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT
}

// signalName names sig as kubelet does, real-time signals counted from
// the nearer of SIGRTMIN and SIGRTMAX (CRI names SIGRTMIN+15 and
// SIGRTMAX-14, which are one signal apart, never SIGRTMIN+16).
func signalName(sig syscall.Signal) string {
	switch n := int(sig); {
	case n == sigRTMin:
		return "SIGRTMIN"
	case n > sigRTMin && n <= sigRTMin+15:
		return "SIGRTMIN+" + strconv.Itoa(n-sigRTMin)
	case n == sigRTMax:
		return "SIGRTMAX"
	case n > sigRTMin+15 && n < sigRTMax:
		return "SIGRTMAX-" + strconv.Itoa(sigRTMax-n)
	}
	return unix.SignalName(sig)
}
