package nsmgr

import (
	"os"
	"testing"
)

// TestMain lets the test binary act as the namespace helper, the way
// cmd/pinrt's main does: Manager re-executes /proc/self/exe.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == HelperCommand {
		os.Exit(HelperMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}
