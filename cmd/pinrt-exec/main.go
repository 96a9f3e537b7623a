// pinrt-exec is the exec helper of pinrt's streaming execs (package
// internal/exechelper), in a binary of its own that starts fast. The
// daemon runs it from beside its own binary, and runs itself as the
// helper when it is not there.
package main

import (
	"fmt"
	"os"

	"github.com/pinrt/pinrt/internal/exechelper"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == exechelper.Command {
		os.Exit(exechelper.Main(os.Args[2:]))
	}
	fmt.Fprintf(os.Stderr, "pinrt-exec is run by pinrt for streaming execs: %s %s <pid-file> <runtime> <args...>\n", os.Args[0], exechelper.Command)
	os.Exit(2)
}
