package nsmgr

import "github.com/pinrt/pinrt/nsmgr/nshelper"

// The helper's arguments, shared with its body in nshelper.
const (
	hostnameArg = nshelper.HostnameArg
	loArg       = nshelper.LoArg
)

// HelperMain is the body of the re-executed helper (see nshelper.Main),
// for a binary that is its own helper: pinrt without pinrt-nshelper next
// to it, and this package's tests.
func HelperMain(args []string) int { return nshelper.Main(args) }
