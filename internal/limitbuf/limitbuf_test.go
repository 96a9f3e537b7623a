package limitbuf

import (
	"io"
	"strings"
	"testing"
)

func TestBufferKeepsFirstMaxBytes(t *testing.T) {
	b := &Buffer{Max: 5}
	n, err := io.Copy(b, strings.NewReader("hello world"))
	if err != nil || n != 11 {
		t.Fatalf("copy = %d, %v; want 11, nil", n, err)
	}
	if got := b.String(); got != "hello" {
		t.Fatalf("kept %q, want %q", got, "hello")
	}
	if n, err := b.Write([]byte("more")); err != nil || n != 4 || b.Len() != 5 {
		t.Fatalf("write past Max = %d, %v, len %d", n, err, b.Len())
	}
}
