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
	os.Exit(code)
}
