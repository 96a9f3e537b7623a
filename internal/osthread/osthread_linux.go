// Package osthread runs work on an OS thread of its own that ends with
// it, for the changes a thread can make to itself alone: joining
// namespaces, a working directory unshared from the process.
package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Go calls f in a new goroutine locked to its OS thread, and lets that
// thread end when f returns, with whatever f changed in it. The process's
// main thread cannot end (the Go runtime parks it for good instead), so
// when the goroutine lands there it holds the main thread and f runs on
// another.
func Go(f func()) {
	go run(f)
}

func run(f func()) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			run(f)
		}()
		<-done
		runtime.UnlockOSThread()
		return
	}
	f() // returns still locked: the thread ends
}
