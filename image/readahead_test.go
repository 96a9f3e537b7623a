package image

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
	"time"
)

// The bytes come out as they went in, whatever the chunk size and however
// short the source's reads.
func TestReadAheadCopies(t *testing.T) {
	data := make([]byte, 1<<20+123)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	plain := func(r io.Reader) io.Reader { return r }
	for _, tc := range []struct {
		name         string
		data         []byte
		wrap         func(io.Reader) io.Reader
		chunk, depth int
	}{
		{"big chunks", data, plain, 256 << 10, 4},
		{"one-byte source reads", data[:70000], iotest.OneByteReader, 4096, 2},
		{"half reads, odd chunk", data, iotest.HalfReader, 1000, 1},
		{"empty", nil, plain, 4096, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ra := newReadAhead(tc.wrap(bytes.NewReader(tc.data)), tc.chunk, tc.depth)
			got, err := io.ReadAll(iotest.OneByteReader(ra))
			ra.stop()
			ra.wait()
			if err != nil || !bytes.Equal(got, tc.data) {
				t.Fatalf("read %d bytes, %v; want the %d bytes of the source", len(got), err, len(tc.data))
			}
		})
	}
}

// The source's error reaches the reader as it is, after every byte read
// before it: a truncated download stays an error.
func TestReadAheadPassesErrors(t *testing.T) {
	for _, want := range []error{io.ErrUnexpectedEOF, errors.New("connection reset")} {
		src := io.MultiReader(bytes.NewReader([]byte("abcdef")), iotest.ErrReader(want))
		ra := newReadAhead(src, 4, 2)
		got, err := io.ReadAll(ra)
		ra.wait()
		if string(got) != "abcdef" || !errors.Is(err, want) {
			t.Errorf("ReadAll = %q, %v; want abcdef, %v", got, err, want)
		}
	}
}

// blockingReader blocks in Read until it is closed, like a body whose
// server went quiet.
type blockingReader struct{ closed chan struct{} }

func (b *blockingReader) Read([]byte) (int, error) {
	<-b.closed
	return 0, errors.New("read on closed body")
}

func (b *blockingReader) Close() error { close(b.closed); return nil }

// A consumer that gives up ends the goroutine: one parked on a full
// queue at stop, one blocked on the network once its body is closed.
func TestReadAheadStops(t *testing.T) {
	ra := newReadAhead(bytes.NewReader(make([]byte, 1<<20)), 1024, 2)
	buf := make([]byte, 10)
	if _, err := ra.Read(buf); err != nil {
		t.Fatal(err)
	}
	ra.stop()
	waitOrFail(t, ra, "parked on a full queue")

	body := &blockingReader{closed: make(chan struct{})}
	ra = newReadAhead(body, 1024, 2)
	ra.stop()
	_ = body.Close()
	waitOrFail(t, ra, "blocked in the body's Read")
}

func waitOrFail(t *testing.T, ra *readAhead, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { ra.wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the read-ahead goroutine %s did not end", what)
	}
}
