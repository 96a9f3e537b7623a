package cni

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// startWithEnv starts `sleep 60` with env added to ours, in its own
// process group so the test can kill it whatever happens.
func startWithEnv(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// Start returns once the exec has begun; the environment reads empty
	// until the kernel has laid it out.
	last := []byte(cmd.Env[len(cmd.Env)-1] + "\x00")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid)); bytes.Contains(b, last) {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d shows no %q in its environment", cmd.Process.Pid, last)
		}
	}
}

func TestKillStrays(t *testing.T) {
	const id = "4f2a0c7e9b1d"
	target := startWithEnv(t, "CNI_COMMAND=ADD", "CNI_CONTAINERID="+id, "CNI_IFNAME=eth0")
	// Another pod whose ID extends this one's, and a process without CNI
	// variables, must survive.
	other := startWithEnv(t, "CNI_CONTAINERID="+id+"ff")
	plain := startWithEnv(t)
	exited := make(chan error, 1)
	go func() { exited <- target.Wait() }()

	n, err := killStrays(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("killed %d processes, want 1", n)
	}
	select {
	case err := <-exited:
		if ws, ok := target.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("the stray ended with %v, want SIGKILL", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stray still runs")
	}
	for _, c := range []*exec.Cmd{other, plain} {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("process %d (%v) was killed: %v", c.Process.Pid, c.Env[len(c.Env)-1], err)
		}
	}
}

func TestHasEnv(t *testing.T) {
	want := []byte("CNI_CONTAINERID=abc\x00")
	for env, ok := range map[string]bool{
		"CNI_CONTAINERID=abc\x00PATH=/bin\x00":   true,
		"PATH=/bin\x00CNI_CONTAINERID=abc\x00":   true,
		"PATH=/bin\x00CNI_CONTAINERID=abcd\x00":  false,
		"PATH=/bin\x00X_CNI_CONTAINERID=abc\x00": false,
		"":                                       false,
	} {
		if got := hasEnv([]byte(env), want); got != ok {
			t.Errorf("hasEnv(%q) = %v, want %v", env, got, ok)
		}
	}
}
