//go:build linux

// Command pinrt-nshelper is pinrt's namespace helper as a binary of its
// own: pinrt starts it for a pod with a user namespace, it clones itself
// into the pod's new namespaces, where it sets the hostname, brings up lo,
// writes the pod's sysctls and reports ready.
// Installed next to pinrt, it replaces re-executing the pinrt binary,
// which pays the start-up of everything pinrt links for every pod.
//
//	pinrt-nshelper __pinrt-nshelper [--userns=KINDS --uid-map=MAP --gid-map=MAP] [--lo-up] [--hostname=NAME] [path=value...]
package main

import (
	"os"

	"github.com/pinrt/pinrt/nsmgr/nshelper"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != nshelper.Command {
		_, _ = os.Stderr.WriteString("pinrt-nshelper is started by pinrt, not by hand\n")
		os.Exit(2)
	}
	os.Exit(nshelper.Main(os.Args[2:]))
}
