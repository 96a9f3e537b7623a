package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// progressLogInterval is how often a running pull logs its progress.
const progressLogInterval = 10 * time.Second

// stallError is the cause a pull is cancelled with when the registry sent
// nothing for PullProgressTimeout. It names the setting so that whoever
// reads kubelet's event knows what to raise.
func stallError(timeout time.Duration) error {
	return fmt.Errorf("no data from the registry for %s (image.pull_progress_timeout): %w", timeout, errdefs.ErrUnavailable)
}

// pullProgress counts what one pull has received from registries. Every
// byte of every response body counts, manifests and configs included, so
// the stall watchdog sees the whole pull and not only layer downloads.
type pullProgress struct {
	bytes atomic.Int64
	// last is the UnixNano of the last byte or response header.
	last atomic.Int64
	// bodies is the number of response bodies open. Only while one is
	// open can the registry be stalling us: between requests the time
	// goes to local work (unpacking a cached blob, fsync), which must
	// not count as a stall.
	bodies atomic.Int64
	// netWait is the time spent blocked reading response bodies, summed
	// over concurrent downloads: the "download" share of a pull.
	netWait atomic.Int64
}

func newPullProgress() *pullProgress {
	p := &pullProgress{}
	p.touch()
	return p
}

func (p *pullProgress) touch() { p.last.Store(time.Now().UnixNano()) }

func (p *pullProgress) idle() time.Duration {
	return time.Since(time.Unix(0, p.last.Load()))
}

// watch runs the stall watchdog and the periodic progress log until stop
// is called. On a stall it cancels the pull with stallError as cause.
func (p *pullProgress) watch(ctx context.Context, cancel context.CancelCauseFunc, timeout, logEvery time.Duration, img string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	// Check often enough that a stall is reported within ~10% of the
	// timeout, but don't spin for long timeouts.
	tick := min(max(timeout/10, 10*time.Millisecond), time.Second, logEvery)
	start := time.Now()
	wg.Go(func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		nextLog := start.Add(logEvery)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-t.C:
				if p.bodies.Load() > 0 && p.idle() > timeout {
					log.G(ctx).WithField("image", img).WithField("idle", p.idle().Round(time.Millisecond).String()).
						Warn("image pull stalled; cancelling")
					cancel(stallError(timeout))
					return
				}
				if now.After(nextLog) {
					nextLog = now.Add(logEvery)
					n := p.bytes.Load()
					log.G(ctx).WithField("image", img).WithField("bytes", n).
						WithField("elapsed", now.Sub(start).Round(100*time.Millisecond).String()).
						WithField("mb_per_s", mbPerSec(n, now.Sub(start))).Info("image pull progress")
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// mbPerSec is a rate in MB/s (10^6 bytes) rounded to 0.1, for log lines.
func mbPerSec(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(int64(float64(n)/d.Seconds()/1e5)) / 10
}

// progressTransport is the innermost http.RoundTripper of a pull: it sees
// every exchange with the registry, token requests included.
type progressTransport struct {
	base    http.RoundTripper
	p       *pullProgress
	blobs   *blobChecks
	timeout time.Duration
}

func (t *progressTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		// The transport's ResponseHeaderTimeout is the stall bound for
		// the time before the headers; say which setting fired. It is an
		// error of this one request, so a mirror that accepts and never
		// answers hands over to the next endpoint instead of failing the
		// whole pull.
		if isHeaderTimeout(req, err) {
			return nil, fmt.Errorf("%s %s: no response headers: %w", req.Method, req.URL.Redacted(), stallError(t.timeout))
		}
		return nil, err
	}
	t.p.touch()
	body, err := t.blobs.check(req, resp)
	if err != nil {
		return nil, err
	}
	t.p.bodies.Add(1)
	resp.Body = &progressBody{rc: body, p: t.p}
	return resp, nil
}

// isHeaderTimeout recognises net/http's "timeout awaiting response
// headers": a timeout while the request's own context is still live (it
// may wrap context.DeadlineExceeded, so that alone cannot tell).
func isHeaderTimeout(req *http.Request, err error) bool {
	var nerr net.Error
	return req.Context().Err() == nil && errors.As(err, &nerr) && nerr.Timeout()
}

type progressBody struct {
	rc   io.ReadCloser
	p    *pullProgress
	done atomic.Bool
}

func (b *progressBody) Read(buf []byte) (int, error) {
	start := time.Now()
	n, err := b.rc.Read(buf)
	b.p.netWait.Add(int64(time.Since(start)))
	if n > 0 {
		b.p.bytes.Add(int64(n))
		b.p.touch()
	}
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *progressBody) Close() error {
	b.finish()
	return b.rc.Close()
}

// finish marks the body as no longer awaited, once, at EOF, error or
// Close, whichever comes first.
func (b *progressBody) finish() {
	if b.done.CompareAndSwap(false, true) {
		b.p.bodies.Add(-1)
	}
}
