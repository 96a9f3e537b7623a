// pinrt-exec is pinrt's small helper binary, which starts fast and maps
// little memory: the exec helper of streaming execs (package
// internal/exechelper) and the pause process of shared-PID pods (package
// internal/pause). The daemon runs it from beside its own binary, and
// runs itself in its place when it is not there.
package main

import (
	"fmt"
	"os"

	"github.com/pinrt/pinrt/internal/exechelper"
	"github.com/pinrt/pinrt/internal/pause"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == exechelper.Command {
		os.Exit(exechelper.Main(os.Args[2:]))
	}
	if len(os.Args) == 2 && os.Args[1] == pause.Command {
		os.Exit(pause.Main())
	}
	fmt.Fprintf(os.Stderr, "pinrt-exec is run by pinrt: %s %s <pid-file> <runtime> <args...> (a streaming exec), or %s %s (a pod's pause process)\n",
		os.Args[0], exechelper.Command, os.Args[0], pause.Command)
	os.Exit(2)
}
