package bench

import (
	"strings"
	"testing"
)

func TestStreamURL(t *testing.T) {
	for _, tc := range []struct {
		in, err string
	}{
		{in: "http://127.0.0.1:34567/exec/abc"},
		{in: "https://[::1]:1/portforward/x"},
		{in: "/exec/abc", err: "not absolute"},
		{in: "", err: "not absolute"},
		{in: "http://%zz", err: "streaming URL"},
	} {
		u, err := streamURL(tc.in)
		switch {
		case tc.err == "" && (err != nil || u.String() != tc.in):
			t.Errorf("streamURL(%q) = %v, %v", tc.in, u, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("streamURL(%q) error %v, want %q", tc.in, err, tc.err)
		}
	}
}

func TestCheckExecOutput(t *testing.T) {
	if err := checkExecOutput(0, "hi\n", ""); err != nil {
		t.Error(err)
	}
	if err := checkExecOutput(1, "hi\n", ""); err == nil {
		t.Error("exit code 1 accepted")
	}
	if err := checkExecOutput(0, "ho\n", "oops"); err == nil || !strings.Contains(err.Error(), "oops") {
		t.Errorf("wrong output: %v", err)
	}
}

func TestExecStreamsDefault(t *testing.T) {
	for _, tc := range []struct{ n, streams, want int }{
		{100, 0, 10}, {5, 0, 1}, {100, -1, 0}, {100, 3, 3},
	} {
		c := Config{N: tc.n, Streams: tc.streams}
		if got := c.execStreams(); got != tc.want {
			t.Errorf("N=%d Streams=%d: %d streaming execs, want %d", tc.n, tc.streams, got, tc.want)
		}
	}
}
