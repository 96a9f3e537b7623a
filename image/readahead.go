package image

import (
	"io"
	"sync"
)

// readAhead reads a layer's download in a goroutine of its own, up to
// depth chunks ahead of the unpack: the socket, the copy into the blob
// file and the compressed digest then run while the inflate and the
// layer's file writes do, instead of each waiting for the other, and the
// registry's stream is not stalled by a slow write.
//
// stop ends the goroutine's reads at the next chunk; a Read blocked on
// the network needs its body closed too (see stageLayer), after which
// wait returns.
type readAhead struct {
	full chan []byte // chunks read, in order
	free chan []byte // chunks the consumer is done with
	done chan struct{}
	err  error // why the reads ended; set before full is closed

	cur  []byte // the chunk being consumed
	off  int
	once sync.Once
	wg   sync.WaitGroup
}

func newReadAhead(r io.Reader, chunk, depth int) *readAhead {
	ra := &readAhead{full: make(chan []byte, depth), free: make(chan []byte, depth+1), done: make(chan struct{})}
	for range depth + 1 {
		ra.free <- make([]byte, chunk)
	}
	ra.wg.Add(1)
	go ra.fill(r)
	return ra
}

func (ra *readAhead) fill(r io.Reader) {
	defer ra.wg.Done()
	defer close(ra.full)
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			return
		}
		// Fill the chunk, passing on the reader's own error as it is (a
		// truncated body must stay an error, not become an EOF).
		n := 0
		var err error
		for n < len(buf) && err == nil {
			var m int
			m, err = r.Read(buf[n:])
			n += m
		}
		if n > 0 {
			select {
			case ra.full <- buf[:n]:
			case <-ra.done:
				return
			}
		}
		if err != nil {
			ra.err = err
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for ra.off == len(ra.cur) {
		if ra.cur != nil {
			ra.free <- ra.cur[:cap(ra.cur)]
			ra.cur, ra.off = nil, 0
		}
		buf, ok := <-ra.full
		if !ok {
			return 0, ra.err
		}
		ra.cur = buf
	}
	n := copy(p, ra.cur[ra.off:])
	ra.off += n
	return n, nil
}

// stop tells the goroutine to read no further.
func (ra *readAhead) stop() { ra.once.Do(func() { close(ra.done) }) }

// wait waits for the goroutine to end; after stop and the close of the
// reader it reads, it returns promptly.
func (ra *readAhead) wait() { ra.wg.Wait() }
