package test

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMain(m *testing.M) {
	code := Main(m)
	if nriPluginBin != "" && os.Getenv("PINRT_E2E_NRIPLUGIN") == "" {
		_ = os.RemoveAll(filepath.Dir(nriPluginBin))
	}
	if cniGateDir != "" {
		_ = os.RemoveAll(cniGateDir) // built once for the crash tests (cniGatePlugin)
	}
	os.Exit(code)
}
