package nsmgr

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// createInChildEnv makes the test binary create a pod's namespaces and
// exit, so a test can prove that pins outlive the process that made them.
const createInChildEnv = "NSMGR_TEST_CREATE_IN"

// TestMain lets the test binary create namespaces in a child of its own.
func TestMain(m *testing.M) {
	if dir := os.Getenv(createInChildEnv); dir != "" {
		os.Exit(createInChild(dir))
	}
	os.Exit(m.Run())
}

func createInChild(dir string) int {
	m, err := NewManager(dir)
	if err == nil {
		_, err = m.Create(context.Background(), fullRequest("restart", 9, nil))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
