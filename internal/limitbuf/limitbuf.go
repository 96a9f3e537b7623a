// Package limitbuf holds pinrt's one bounded output buffer: it keeps the
// first Max bytes written and discards the rest, so a runaway child
// process can't grow the daemon's memory.
package limitbuf

import "bytes"

// Buffer keeps at most Max bytes. Writes past the bound are dropped but
// reported as written, so an io.Copy into it drains its source instead of
// failing. It does not embed bytes.Buffer on purpose: the promoted
// ReadFrom would let io.Copy bypass Write and the bound.
type Buffer struct {
	buf bytes.Buffer
	Max int
}

// Write keeps what fits under Max and always reports len(p), nil.
func (b *Buffer) Write(p []byte) (int, error) {
	if room := b.Max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// Bytes returns what was kept.
func (b *Buffer) Bytes() []byte { return b.buf.Bytes() }

// String returns what was kept.
func (b *Buffer) String() string { return b.buf.String() }

// Len is the number of bytes kept.
func (b *Buffer) Len() int { return b.buf.Len() }
