package k8snode

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// The node e2e specs that change kubelet's configuration, or restart it,
// run `sudo systemctl kill|restart|reset-failed <unit>` and find the unit
// with `systemctl list-units '*kubelet*'`. On a host without systemd the
// test binary itself is that systemctl (bin/systemctl, a link to it): it
// hands its arguments to the test, which stops and starts the node's
// kubelet as its own child, and prints what the test answers.

// systemctlEnv names the test's socket for the systemctl shim.
const systemctlEnv = "PINRT_K8SNODE_SYSTEMCTL"

// kubeletUnitName is the unit the shim says kubelet runs as: the specs
// take the first match of kubelet-\w+ from list-units.
const kubeletUnitName = "kubelet-k8snode.service"

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "systemctl" {
		os.Exit(systemctlShim(os.Args[1:]))
	}
	os.Exit(m.Run())
}

type systemctlReply struct {
	Code int
	Out  string
}

// systemctlShim sends args to the test and returns the exit code it
// answers with.
func systemctlShim(args []string) int {
	sock := os.Getenv(systemctlEnv)
	if sock == "" {
		fmt.Fprintln(os.Stderr, "systemctl: no systemd here, and", systemctlEnv, "names no k8snode test")
		return 1
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "systemctl:", err)
		return 1
	}
	defer conn.Close()
	var r systemctlReply
	err = json.NewEncoder(conn).Encode(args)
	if err == nil {
		err = json.NewDecoder(conn).Decode(&r)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "systemctl:", err)
		return 1
	}
	fmt.Print(r.Out)
	return r.Code
}

// systemctlSock is where the test answers the shim.
func (n *node) systemctlSock() string { return n.path("systemctl.sock") }

// serveSystemctl answers the shim until the test ends. One request at a
// time: the specs that use it are serial.
func (n *node) serveSystemctl(t *testing.T) {
	l, err := net.Listen("unix", n.systemctlSock())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			var args []string
			r := systemctlReply{Code: 1, Out: "bad request\n"}
			if json.NewDecoder(conn).Decode(&args) == nil {
				r = n.systemctl(args)
			}
			_ = json.NewEncoder(conn).Encode(r)
			_ = conn.Close()
		}
	}()
}

// systemctl does what systemctl would do with args to the node's kubelet.
func (n *node) systemctl(args []string) systemctlReply {
	n.t.Logf("systemctl %s", strings.Join(args, " "))
	if len(args) == 0 {
		return systemctlReply{Code: 1, Out: "systemctl: no verb\n"}
	}
	verb, rest := args[0], args[1:]
	if verb == "list-units" {
		if slices.Contains(rest, "--state=running") && !n.kubeletRunning() {
			return systemctlReply{Out: "0 loaded units listed.\n"}
		}
		return systemctlReply{Out: kubeletUnitName + " loaded active running kubelet (k8snode test)\n"}
	}
	if len(rest) != 1 || strings.TrimSuffix(rest[0], ".service") != strings.TrimSuffix(kubeletUnitName, ".service") {
		return systemctlReply{Code: 5, Out: fmt.Sprintf("systemctl %s: only %s is known here\n", strings.Join(args, " "), kubeletUnitName)}
	}
	switch verb {
	case "reset-failed":
	case "kill", "stop":
		n.kubeletSvc.stop()
	case "start":
		if !n.kubeletRunning() {
			n.kubeletSvc.start()
		}
	case "restart":
		n.kubeletSvc.stop()
		n.kubeletSvc.start()
	case "is-active":
		if !n.kubeletRunning() {
			return systemctlReply{Code: 3, Out: "inactive\n"}
		}
		return systemctlReply{Out: "active\n"}
	default:
		return systemctlReply{Code: 1, Out: fmt.Sprintf("systemctl %s: not done by the k8snode test\n", verb)}
	}
	return systemctlReply{}
}

// kubeletRunning says whether kubelet's process runs.
func (n *node) kubeletRunning() bool {
	pid := n.kubeletSvc.mainPID()
	return pid > 0 && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
