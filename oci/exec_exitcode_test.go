package oci

import (
	"errors"
	"os/exec"
	"testing"
)

// A process killed by a signal reports 128 plus the signal, as a shell
// does; Go's -1 would reach client-go, which refuses it.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   int
	}{
		{"exit 0", "exit 0", 0},
		{"exit 3", "exit 3", 3},
		{"hangup", "kill -HUP $$", 129},
		{"killed", "kill -KILL $$", 137},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := exec.Command("sh", "-c", tc.script)
			err := c.Run()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			if got := exitCode(c.ProcessState); got != tc.want {
				t.Fatalf("exitCode after %q = %d, want %d", tc.script, got, tc.want)
			}
		})
	}
}
